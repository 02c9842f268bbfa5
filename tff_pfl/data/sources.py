"""Loaders that turn data set files into in-memory `ArrayDataset`s.

Every loader returns an `ArrayDataset` (see `tff_pfl.data.dataset` for the
dtype and layout conventions). This module gathers them:

*   `load_sklearn`: small sets shipped with scikit-learn.
*   `load_npz`: NumPy archives (Keras, MedMNIST and test-only layouts).
*   `load_image_folder`: `<class>/<file>` folders or zips, with a cache.
*   `load_csv`: tabular CSV files.
*   `load_tfds`: TensorFlow Datasets, which may download.

Apart from `load_tfds`, the loaders only read local files.
"""

from collections.abc import Sequence
import os
from typing import Optional
import zipfile

import numpy as np

from tff_pfl.data import dataset
from tff_pfl.data import image_folder
from tff_pfl.data import tables

ArrayDataset = dataset.ArrayDataset
CLASSIFICATION = dataset.CLASSIFICATION
REGRESSION = dataset.REGRESSION
PathLike = dataset.PathLike
default_cache_dir = image_folder.default_cache_dir
load_image_folder = image_folder.load_image_folder
load_csv = tables.load_csv


def load_sklearn(
    name: str, *, standardize: bool = True
) -> dataset.ArrayDataset:
  """Loads a small data set that ships with scikit-learn (no download).

  'digits' gives 1,797 8x8 grayscale images as float32 (8, 8, 1) scaled by
  1/16 into [0, 1]. 'iris', 'wine' and 'breast_cancer' give tabular float32
  features. None of them has an official test split, so everything is in
  `x_train` and `x_test` is None.

  Args:
    name: One of 'digits', 'iris', 'wine', 'breast_cancer'.
    standardize: For the tabular sets, scale every feature to zero mean and
      unit variance. The statistics come from the whole table, which is
      harmless here because these sets have no held-out split; per-client
      test splits therefore see the same transform as training data.

  Returns:
    An `ArrayDataset`.

  Raises:
    ValueError: If `name` is not one of the supported data sets.
  """
  # pylint: disable-next=import-outside-toplevel
  from sklearn import datasets as sk_datasets

  loaders = {
      'digits': sk_datasets.load_digits,
      'iris': sk_datasets.load_iris,
      'wine': sk_datasets.load_wine,
      'breast_cancer': sk_datasets.load_breast_cancer,
  }
  if name not in loaders:
    raise ValueError(
        f'Unknown scikit-learn data set {name!r}; known: {sorted(loaders)}.'
    )
  bunch = loaders[name]()
  y = np.asarray(bunch.target, dtype=np.int64)
  class_names = tuple(str(c) for c in bunch.target_names)
  if name == 'digits':
    x = (np.asarray(bunch.images, dtype=np.float32) / 16.0)[..., np.newaxis]
    feature_names = ()
  else:
    x = np.asarray(bunch.data, dtype=np.float64)
    if standardize:
      x = _standardize(x)
    x = x.astype(np.float32)
    feature_names = tuple(str(f) for f in bunch.feature_names)
  return dataset.ArrayDataset(
      name=name,
      x_train=x,
      y_train=y,
      x_test=None,
      y_test=None,
      num_classes=len(class_names),
      class_names=class_names,
      task=dataset.CLASSIFICATION,
      feature_names=feature_names,
  )


def _standardize(x: np.ndarray) -> np.ndarray:
  mean = x.mean(axis=0)
  std = x.std(axis=0)
  std[std == 0] = 1.0
  return (x - mean) / std


def load_npz(
    path: dataset.PathLike,
    *,
    name: Optional[str] = None,
    class_names: Optional[Sequence[str]] = None,
) -> dataset.ArrayDataset:
  """Loads an image classification data set from a NumPy .npz file.

  Three key layouts are understood:

  *   Keras style `x_train, y_train[, x_test, y_test]` (e.g. MNIST).
  *   MedMNIST style `train_images, train_labels, val_images, val_labels,
      test_images, test_labels`; the validation split is appended to the
      training split (val keys are optional).
  *   Test-only files with just `x_test, y_test` (e.g. the MNIST-M copy in
      shared data): the only split becomes `x_train` and `x_test` is None, so
      that per-client splitting treats it like any unsplit source.

  uint8 images are scaled to float32 in [0, 1]; (N, H, W) arrays get a
  channel axis. Labels of shape (N, 1) are flattened.

  Args:
    path: The .npz file.
    name: Data set name; defaults to the file name without extension.
    class_names: Optional class names; defaults to '0', '1', ...

  Returns:
    An `ArrayDataset`.

  Raises:
    FileNotFoundError: If `path` does not exist.
    ValueError: If the keys match none of the layouts above, or the arrays
      are malformed.
  """
  path = dataset.existing_path(path)
  name = name or path.stem
  try:
    archive = np.load(path, allow_pickle=False)
  except (OSError, ValueError, zipfile.BadZipFile) as e:
    raise ValueError(f'{str(path)!r} is not a readable .npz file: {e}') from e
  if not isinstance(archive, np.lib.npyio.NpzFile):
    raise ValueError(f'{str(path)!r} holds one array, not an .npz archive '
                     'of named arrays.')
  with archive as data:
    keys = set(data.files)
    if {'x_train', 'y_train'} <= keys:
      x_train = dataset.images_to_float(data['x_train'], 'x_train')
      y_train = dataset.integer_labels(data['y_train'], 'y_train')
      if {'x_test', 'y_test'} <= keys:
        x_test = dataset.images_to_float(data['x_test'], 'x_test')
        y_test = dataset.integer_labels(data['y_test'], 'y_test')
      else:
        x_test = y_test = None
    elif {'train_images', 'train_labels'} <= keys:
      xs = [dataset.images_to_float(data['train_images'], 'train_images')]
      ys = [dataset.integer_labels(data['train_labels'], 'train_labels')]
      if {'val_images', 'val_labels'} <= keys:
        xs.append(dataset.images_to_float(data['val_images'], 'val_images'))
        ys.append(dataset.integer_labels(data['val_labels'], 'val_labels'))
      if xs[-1].shape[1:] != xs[0].shape[1:]:
        raise ValueError(
            f'{str(path)!r}: val_images {xs[-1].shape[1:]} and train_images '
            f'{xs[0].shape[1:]} differ in image shape.'
        )
      x_train = np.concatenate(xs)
      y_train = np.concatenate(ys)
      if {'test_images', 'test_labels'} <= keys:
        x_test = dataset.images_to_float(data['test_images'], 'test_images')
        y_test = dataset.integer_labels(data['test_labels'], 'test_labels')
      else:
        x_test = y_test = None
    elif {'x_test', 'y_test'} <= keys:
      x_train = dataset.images_to_float(data['x_test'], 'x_test')
      y_train = dataset.integer_labels(data['y_test'], 'y_test')
      x_test = y_test = None
    else:
      raise ValueError(
          f'{str(path)!r} has keys {sorted(keys)}; expected x_train/y_train '
          '[x_test/y_test], MedMNIST train_images/train_labels[/val_*/test_*] '
          'or a test-only x_test/y_test.'
      )
  if x_test is not None and x_test.shape[1:] != x_train.shape[1:]:
    raise ValueError(
        f'{str(path)!r}: its test images {x_test.shape[1:]} and training '
        f'images {x_train.shape[1:]} differ in shape.'
    )
  all_labels = y_train if y_test is None else np.concatenate([y_train, y_test])
  if all_labels.size and all_labels.min() < 0:
    raise ValueError(f'{str(path)!r} has negative labels.')
  num_classes = int(all_labels.max()) + 1 if all_labels.size else 0
  if class_names is None:
    class_names = tuple(str(i) for i in range(num_classes))
  else:
    class_names = tuple(class_names)
    if len(class_names) < num_classes:
      raise ValueError(
          f'{str(path)!r} has labels up to {num_classes - 1} but only '
          f'{len(class_names)} class names were given.'
      )
    num_classes = len(class_names)
  return dataset.ArrayDataset(
      name=name,
      x_train=x_train,
      y_train=y_train,
      x_test=x_test,
      y_test=y_test,
      num_classes=num_classes,
      class_names=class_names,
      task=dataset.CLASSIFICATION,
  )


def load_tfds(
    name: str,
    *,
    data_dir: Optional[dataset.PathLike] = None,
    split_train: str = 'train',
    split_test: Optional[str] = 'test',
    image_key: str = 'image',
    label_key: str = 'label',
) -> dataset.ArrayDataset:
  """Loads an image classification data set through TensorFlow Datasets.

  This calls `tfds.load(name, as_supervised=False, batch_size=-1)`, which
  downloads and prepares the data set under `data_dir` when it is not there
  yet; on a machine without network access it only works if the data set
  was prepared beforehand (e.g. `tfds build` elsewhere, then copy data_dir).

  Args:
    name: The TFDS name, e.g. 'cifar100'.
    data_dir: The TFDS data directory; TFDS's default when None.
    split_train: The split to use as training data.
    split_test: The split to use as test data, or None for none.
    image_key: The feature holding the images.
    label_key: The feature holding the integer labels (e.g. 'coarse_label'
      for the 20 CIFAR-100 superclasses).

  Returns:
    An `ArrayDataset` of float32 images in [0, 1].

  Raises:
    ImportError: If tensorflow_datasets is not installed.
    ValueError: If TFDS does not know `name`, or the keys are missing.
    FileNotFoundError: If the data set is not prepared and cannot be
      downloaded (e.g. no network).
  """
  try:
    # pylint: disable-next=import-outside-toplevel
    import tensorflow_datasets as tfds
  except ImportError as e:
    raise ImportError(
        f'Loading {name!r} needs the tensorflow_datasets package.'
    ) from e
  splits = [split_train] + ([split_test] if split_test else [])
  where = f'data_dir={str(data_dir)!r}' if data_dir else 'the default data_dir'
  try:
    loaded, info = tfds.load(
        name,
        split=splits,
        data_dir=None if data_dir is None else os.fspath(data_dir),
        as_supervised=False,
        batch_size=-1,
        with_info=True,
    )
  except Exception as e:  # TFDS and its download stack raise many types.
    not_found = getattr(
        getattr(tfds.core, 'registered', None), 'DatasetNotFoundError', None
    )
    if not_found is not None and isinstance(e, not_found):
      raise ValueError(f'TFDS does not know a data set named {name!r}.') from e
    raise FileNotFoundError(
        f'Could not load TFDS data set {name!r} from {where}: {e}. If this '
        'machine has no network, prepare the data set elsewhere (tfds build '
        f'{name}) and pass that data_dir.'
    ) from e
  arrays = []
  for split, features in zip(splits, loaded):
    features = {k: np.asarray(v) for k, v in features.items()}
    missing = [k for k in (image_key, label_key) if k not in features]
    if missing:
      raise ValueError(
          f'TFDS data set {name!r} split {split!r} has no feature(s) '
          f'{missing}; features are {sorted(features)}.'
      )
    arrays.append((
        dataset.images_to_float(np.asarray(features[image_key]), image_key),
        dataset.integer_labels(np.asarray(features[label_key]), label_key),
    ))
  label_feature = info.features[label_key]
  num_classes = int(getattr(label_feature, 'num_classes', 0) or 0)
  if num_classes:
    class_names = tuple(label_feature.names)
  else:
    num_classes = 1 + max(int(y.max()) for _, y in arrays if y.size)
    class_names = tuple(str(i) for i in range(num_classes))
  x_test, y_test = arrays[1] if len(arrays) > 1 else (None, None)
  return dataset.ArrayDataset(
      name=name,
      x_train=arrays[0][0],
      y_train=arrays[0][1],
      x_test=x_test,
      y_test=y_test,
      num_classes=num_classes,
      class_names=class_names,
      task=dataset.CLASSIFICATION,
  )
