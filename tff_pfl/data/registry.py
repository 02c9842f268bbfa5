"""Named data sets: which file each one needs and how to load it.

`load_dataset('mnist')` looks for `mnist.npz` in the data folder, which is,
in order: the `data_dir` argument, `$TFF_PFL_DATA_DIR`, or `shared/data`
beside the repository (`<repo root>/../shared/data`). Names of the form
'tfds:<name>' load through TensorFlow Datasets (network or a prepared TFDS
`data_dir` needed); for them and for 'cifar100', `data_dir` is passed on as
the TFDS data directory.
"""

from collections.abc import Callable
import dataclasses
import inspect
import os
import pathlib
from typing import Any, Optional, Union

from tff_pfl.data import sources

PathLike = Union[str, os.PathLike]
TFDS_PREFIX = 'tfds:'
DATA_DIR_ENV = 'TFF_PFL_DATA_DIR'


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
  """How to obtain one named data set.

  Attributes:
    name: Registry name.
    description: One line for listings.
    file_name: The file expected in the data folder, or None if the loader
      needs no file (scikit-learn, TFDS).
    loader: Called as `loader(path, **options)` for file data sets and
      `loader(data_dir, **options)` otherwise; returns an `ArrayDataset`.
    source: Where a user gets the file.
  """

  name: str
  description: str
  file_name: Optional[str]
  loader: Callable[..., sources.ArrayDataset]
  source: str

  @property
  def needs_file(self) -> bool:
    """Whether the data set is read from a file in the data folder."""
    return self.file_name is not None


def _sklearn(name: str) -> Callable[..., sources.ArrayDataset]:
  def load(data_dir: Optional[PathLike], *, standardize: bool = True):
    del data_dir  # Ships with scikit-learn.
    return sources.load_sklearn(name, standardize=standardize)

  return load


def _npz(
    name: str, class_names: Optional[tuple[str, ...]] = None
) -> Callable[..., sources.ArrayDataset]:
  def load(path: PathLike):
    return sources.load_npz(path, name=name, class_names=class_names)

  return load


def _load_neu_cls(
    path: PathLike,
    *,
    image_size: Optional[int] = 64,
    grayscale: bool = False,
    cache_dir: Optional[PathLike] = None,
) -> sources.ArrayDataset:
  """NEU-CLS, resized to `image_size` (default 64).

  The originals are 200x200; 1,800 of them at full size are 864 MB as
  float32 and far too slow to train on a CPU, so they are downscaled by
  default. Pass image_size=None for the original resolution, or e.g. 224
  to match ImageNet-style encoders. The images are grayscale stored as RGB;
  grayscale=True keeps one channel.
  """
  return sources.load_image_folder(
      path,
      image_size=image_size,
      grayscale=grayscale,
      name='neu_cls',
      cache_dir=cache_dir,
  )


def _load_cifar10(
    path: PathLike,
    *,
    image_size: Optional[int] = None,
    cache_dir: Optional[PathLike] = None,
) -> sources.ArrayDataset:
  return sources.load_image_folder(
      path, image_size=image_size, name='cifar10', cache_dir=cache_dir
  )


def _csv(
    name: str,
    target: str,
    task: str = sources.CLASSIFICATION,
    default_drop: tuple[str, ...] = (),
) -> Callable[..., sources.ArrayDataset]:
  def load(
      path: PathLike,
      *,
      categorical: Any = 'auto',
      drop: tuple[str, ...] = default_drop,
      standardize: bool = True,
  ):
    return sources.load_csv(
        path,
        target=target,
        task=task,
        categorical=categorical,
        drop=drop,
        name=name,
        standardize=standardize,
    )

  return load


def _tfds(name: str) -> Callable[..., sources.ArrayDataset]:
  def load(data_dir: Optional[PathLike], **options):
    return sources.load_tfds(name, data_dir=data_dir, **options)

  return load


_SHARED = 'shared/data of this project (see its README)'
DATASETS: dict[str, DatasetSpec] = {
    spec.name: spec
    for spec in [
        DatasetSpec(
            'digits',
            'scikit-learn digits, 1,797 8x8 grayscale images, 10 classes',
            None,
            _sklearn('digits'),
            'ships with scikit-learn',
        ),
        DatasetSpec(
            'iris',
            'scikit-learn iris, 150 rows, 4 features, 3 classes',
            None,
            _sklearn('iris'),
            'ships with scikit-learn',
        ),
        DatasetSpec(
            'wine',
            'scikit-learn wine, 178 rows, 13 features, 3 classes',
            None,
            _sklearn('wine'),
            'ships with scikit-learn',
        ),
        DatasetSpec(
            'breast_cancer',
            'scikit-learn breast cancer, 569 rows, 30 features, 2 classes',
            None,
            _sklearn('breast_cancer'),
            'ships with scikit-learn',
        ),
        DatasetSpec(
            'mnist',
            'MNIST, 60,000 train / 10,000 test 28x28 grayscale, 10 classes',
            'mnist.npz',
            _npz('mnist', tuple(str(i) for i in range(10))),
            'keras.datasets.mnist (https://storage.googleapis.com/'
            'tensorflow/tf-keras-datasets/mnist.npz) or ' + _SHARED,
        ),
        DatasetSpec(
            'mnistm',
            'MNIST-M test split only, 9,001 32x32 RGB, 10 classes',
            'mnistm_test_32x32.npz',
            _npz('mnistm', tuple(str(i) for i in range(10))),
            'an MNIST-M release (Ganin & Lempitsky), as an npz with '
            'x_test/y_test, or ' + _SHARED,
        ),
        DatasetSpec(
            'pneumoniamnist',
            'PneumoniaMNIST (MedMNIST), balanced, 28x28 grayscale, 2 classes',
            'pneumoniamnist_balanced_28px.npz',
            _npz('pneumoniamnist', ('normal', 'pneumonia')),
            'MedMNIST (https://medmnist.com, CC BY 4.0) or ' + _SHARED,
        ),
        DatasetSpec(
            'neu_cls',
            'NEU-CLS steel surface defects, 1,800 images, 6 classes',
            'neu_cls.zip',
            _load_neu_cls,
            'Northeastern University surface defect database (Song & Yan '
            '2013), zipped as <class>/<file>.jpg, or ' + _SHARED,
        ),
        DatasetSpec(
            'cifar10',
            'CIFAR-10 as JPEGs, 50,000 train / 10,000 test 32x32, 10 classes',
            'cifar10_jpeg.zip',
            _load_cifar10,
            'CIFAR-10 exported to train|test/<class>/<file>.jpg, or '
            + _SHARED,
        ),
        DatasetSpec(
            'obesity',
            'UCI obesity levels, 2,111 rows, 16 features, 7 classes',
            'obesity.csv',
            _csv('obesity', 'NObeyesdad'),
            'UCI ML repository "Estimation of obesity levels" (CC BY 4.0) or '
            + _SHARED,
        ),
        DatasetSpec(
            'heart_disease',
            'Heart disease (Cleveland, Kaggle coding), 303 rows, 2 classes',
            'heart_disease.csv',
            _csv('heart_disease', 'target'),
            'Kaggle "Heart Disease UCI" (CC BY 4.0) or ' + _SHARED,
        ),
        DatasetSpec(
            'life_expectancy',
            'WHO life expectancy, regression, 2,928 rows with a target',
            'life_expectancy.csv',
            # 'Country' is an identifier with ~190 values: one-hot encoding
            # it would dwarf the 20 real features, and it is the natural
            # client key rather than a feature. Pass drop=() to keep it.
            _csv(
                'life_expectancy',
                'Life expectancy',
                sources.REGRESSION,
                default_drop=('Country',),
            ),
            'Kaggle "Life Expectancy (WHO)" or ' + _SHARED,
        ),
        DatasetSpec(
            'cifar100',
            'CIFAR-100 via TensorFlow Datasets (network or TFDS data_dir)',
            None,
            _tfds('cifar100'),
            'tensorflow_datasets (downloads on first use)',
        ),
    ]
}


def default_data_dir() -> pathlib.Path:
  """`$TFF_PFL_DATA_DIR` if set, else `<repo root>/../shared/data`."""
  env = os.environ.get(DATA_DIR_ENV)
  if env:
    return pathlib.Path(env).expanduser()
  repo_root = pathlib.Path(__file__).resolve().parents[2]
  return (repo_root.parent / 'shared' / 'data').resolve()


def list_datasets() -> list[tuple[str, str, bool]]:
  """(name, description, needs_file) for every registered data set."""
  return [(s.name, s.description, s.needs_file) for s in DATASETS.values()]


def _check_options(spec_name: str, loader: Callable[..., Any], options):
  params = inspect.signature(loader).parameters
  if any(p.kind == p.VAR_KEYWORD for p in params.values()):
    return
  accepted = sorted(
      n for n, p in params.items() if p.kind == p.KEYWORD_ONLY
  )
  unknown = sorted(set(options) - set(accepted))
  if unknown:
    raise ValueError(
        f'Unknown option(s) {unknown} for data set {spec_name!r}; accepted: '
        f'{accepted}.'
    )


def check_name(name: str) -> None:
  """Raises ValueError unless `name` is a key of `DATASETS` or
  'tfds:<tfds name>' (checked without loading anything)."""
  if name.startswith(TFDS_PREFIX):
    if not name[len(TFDS_PREFIX) :]:
      raise ValueError(f"Expected 'tfds:<name>', got {name!r}.")
  elif name not in DATASETS:
    raise ValueError(
        f'Unknown data set {name!r}; known: {sorted(DATASETS)} or '
        "'tfds:<name>'."
    )


def load_dataset(
    name: str, data_dir: Optional[PathLike] = None, **options: Any
) -> sources.ArrayDataset:
  """Loads a registered data set by name.

  Args:
    name: A key of `DATASETS` or 'tfds:<tfds name>'.
    data_dir: Folder holding the data files; defaults to
      `default_data_dir()`. For TFDS data sets, the TFDS data directory.
    **options: Loader options, e.g. `image_size=32` for 'neu_cls',
      `drop=()` for 'life_expectancy', `label_key='coarse_label'` for TFDS.

  Returns:
    The `ArrayDataset`.

  Raises:
    ValueError: For an unknown name or option.
    FileNotFoundError: If the data file is missing; the message gives the
      full expected path and where the data comes from.
  """
  check_name(name)
  if name.startswith(TFDS_PREFIX):
    return sources.load_tfds(name[len(TFDS_PREFIX) :], data_dir=data_dir,
                             **options)
  spec = DATASETS[name]
  _check_options(name, spec.loader, options)
  if not spec.needs_file:
    return spec.loader(data_dir, **options)
  folder = (
      pathlib.Path(data_dir).expanduser()
      if data_dir is not None
      else default_data_dir()
  )
  path = folder / spec.file_name
  if not path.exists():
    raise FileNotFoundError(
        f'Data set {name!r} needs the file {str(path)!r}, which does not '
        f'exist. Get it from {spec.source}, then pass data_dir= or set '
        f'${DATA_DIR_ENV} to its folder.'
    )
  return spec.loader(path, **options)
