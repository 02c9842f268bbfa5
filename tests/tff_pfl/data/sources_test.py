"""Tests for tff_pfl.data.sources (and the modules it gathers)."""

import os
import pathlib
import time
import zipfile

import numpy as np
import pytest

from tff_pfl.data import dataset
from tff_pfl.data import image_folder
from tff_pfl.data import sources


def _dataset(**overrides):
  fields = dict(
      name='toy',
      x_train=np.zeros((4, 2), np.float32),
      y_train=np.array([0, 1, 2, 1]),
      x_test=np.ones((2, 2), np.float32),
      y_test=np.array([2, 0]),
      num_classes=3,
      class_names=('a', 'b', 'c'),
      task='classification',
  )
  fields.update(overrides)
  return sources.ArrayDataset(**fields)


class TestArrayDataset:

  def test_pooled_and_shapes(self):
    d = _dataset()
    x, y = d.pooled()
    assert x.shape == (6, 2) and x.dtype == np.float32
    np.testing.assert_array_equal(y, [0, 1, 2, 1, 2, 0])
    assert y.dtype == np.int64
    assert d.input_shape == (2,)
    assert d.num_examples == 6

  def test_pooled_without_test(self):
    d = _dataset(x_test=None, y_test=None)
    x, y = d.pooled()
    assert x is d.x_train and y is d.y_train

  def test_float64_features_become_float32(self):
    d = _dataset(x_train=np.zeros((4, 2)))
    assert d.x_train.dtype == np.float32

  def test_regression(self):
    d = _dataset(
        y_train=np.arange(4.0),
        y_test=np.arange(2.0),
        num_classes=0,
        class_names=(),
        task='regression',
    )
    assert d.y_train.dtype == np.float32

  @pytest.mark.parametrize(
      'overrides, match',
      [
          (dict(y_train=np.array([0, 1, 2])), 'x_train has 4 examples'),
          (dict(y_train=np.array([0, 1, 3, 1])), r'outside \[0, 3\)'),
          (dict(y_train=np.array([0, -1, 2, 1])), r'outside \[0, 3\)'),
          (
              dict(x_train=np.array([[0, np.nan]] * 4, np.float32)),
              'x_train contains NaN',
          ),
          (dict(x_train=np.zeros((4, 2), np.uint8)), 'dtype uint8'),
          (dict(y_test=None), 'both be set'),
          (dict(x_test=np.ones((2, 3), np.float32)), 'per-example shape'),
          (dict(class_names=('a', 'b')), '2 class names for 3 classes'),
          (dict(task='ranking'), 'task must be one of'),
          (dict(y_train=np.array([0.0, 1, 2, 1])), 'must be integers'),
      ],
  )
  def test_invalid(self, overrides, match):
    with pytest.raises(ValueError, match=match):
      _dataset(**overrides)


class TestLoadSklearn:

  def test_digits(self):
    d = sources.load_sklearn('digits')
    assert d.x_train.shape == (1797, 8, 8, 1)
    assert d.x_train.dtype == np.float32
    assert 0.0 <= d.x_train.min() and d.x_train.max() == 1.0
    assert d.x_test is None and d.num_classes == 10
    assert d.class_names == tuple(str(i) for i in range(10))

  def test_iris_standardized(self):
    d = sources.load_sklearn('iris')
    assert d.x_train.shape == (150, 4)
    np.testing.assert_allclose(d.x_train.mean(axis=0), 0, atol=1e-5)
    np.testing.assert_allclose(d.x_train.std(axis=0), 1, atol=1e-4)
    assert d.class_names == ('setosa', 'versicolor', 'virginica')
    assert len(d.feature_names) == 4

  def test_unstandardized(self):
    d = sources.load_sklearn('wine', standardize=False)
    assert d.x_train.mean() > 1.0

  def test_unknown(self):
    with pytest.raises(ValueError, match=r"'mnist'.*known.*digits"):
      sources.load_sklearn('mnist')


class TestLoadNpz:

  def test_keras_layout(self, tmp_path):
    path = tmp_path / 'toy.npz'
    np.savez(
        path,
        x_train=np.full((5, 4, 4), 255, np.uint8),
        y_train=np.array([0, 1, 2, 1, 0], np.uint8),
        x_test=np.zeros((2, 4, 4), np.uint8),
        y_test=np.array([2, 2], np.uint8),
    )
    d = sources.load_npz(path)
    assert d.name == 'toy'
    assert d.x_train.shape == (5, 4, 4, 1) and d.x_train.dtype == np.float32
    assert d.x_train.max() == 1.0 and d.x_test.max() == 0.0
    assert d.y_train.dtype == np.int64 and d.num_classes == 3

  def test_medmnist_layout_merges_val(self, tmp_path):
    path = tmp_path / 'med.npz'
    np.savez(
        path,
        train_images=np.zeros((4, 3, 3), np.uint8),
        train_labels=np.array([[0], [1], [0], [1]], np.uint8),
        val_images=np.ones((2, 3, 3), np.uint8),
        val_labels=np.array([[1], [1]], np.uint8),
        test_images=np.zeros((3, 3, 3), np.uint8),
        test_labels=np.array([[0], [1], [1]], np.uint8),
    )
    d = sources.load_npz(path, name='med', class_names=('neg', 'pos'))
    assert d.x_train.shape == (6, 3, 3, 1)
    np.testing.assert_array_equal(d.y_train, [0, 1, 0, 1, 1, 1])
    assert d.y_test.shape == (3,)
    assert d.class_names == ('neg', 'pos')

  def test_test_only_file_becomes_train(self, tmp_path):
    path = tmp_path / 'mnistm.npz'
    np.savez(
        path,
        x_test=np.zeros((3, 2, 2, 3), np.uint8),
        y_test=np.array([0, 1, 2]),
    )
    d = sources.load_npz(path)
    assert d.x_train.shape == (3, 2, 2, 3)
    assert d.x_test is None and d.y_test is None

  def test_unknown_keys(self, tmp_path):
    path = tmp_path / 'odd.npz'
    np.savez(path, images=np.zeros((2, 2, 2)), targets=np.zeros(2))
    with pytest.raises(ValueError, match=r"keys \['images', 'targets'\]"):
      sources.load_npz(path)

  def test_bad_float_range(self, tmp_path):
    path = tmp_path / 'f.npz'
    np.savez(path, x_train=np.full((2, 2, 2), 3.0), y_train=np.zeros(2, int))
    with pytest.raises(ValueError, match=r'outside \[0, 1\]'):
      sources.load_npz(path)

  def test_missing_file(self, tmp_path):
    with pytest.raises(FileNotFoundError, match='nope.npz'):
      sources.load_npz(tmp_path / 'nope.npz')

  def test_unreadable_files_are_named(self, tmp_path):
    text = tmp_path / 'text.npz'
    text.write_text('not an archive')
    with pytest.raises(ValueError, match="text.npz' is not a readable .npz"):
      sources.load_npz(text)
    single = tmp_path / 'single.npz'
    with open(single, 'wb') as f:
      np.save(f, np.zeros(3))
    with pytest.raises(ValueError, match='holds one array, not an .npz'):
      sources.load_npz(single)

  def test_image_shapes_are_checked(self, tmp_path):
    path = tmp_path / 'five_d.npz'
    np.savez(path, x_train=np.zeros((2, 4, 4, 1, 1), np.uint8),
             y_train=np.zeros(2, int))
    with pytest.raises(ValueError, match=r"'x_train' has shape \(2, 4, 4, 1, "
                       r'1\); expected images'):
      sources.load_npz(path)
    path = tmp_path / 'mixed.npz'
    np.savez(path, x_train=np.zeros((2, 4, 4), np.uint8),
             y_train=np.zeros(2, int), x_test=np.zeros((2, 5, 5), np.uint8),
             y_test=np.zeros(2, int))
    with pytest.raises(ValueError, match=r'test images \(5, 5, 1\) and '
                       r'training images \(4, 4, 1\) differ'):
      sources.load_npz(path)
    path = tmp_path / 'med.npz'
    np.savez(path, train_images=np.zeros((2, 4, 4), np.uint8),
             train_labels=np.zeros(2, int),
             val_images=np.zeros((2, 3, 3), np.uint8),
             val_labels=np.zeros(2, int))
    with pytest.raises(ValueError, match='val_images .* differ in image shape'):
      sources.load_npz(path)

  def test_labels_beyond_the_class_names_are_refused(self, tmp_path):
    # As the registry loads MNIST: ten class names, so a label of 250 is
    # an error, not a 251-class data set.
    path = tmp_path / 'mnist.npz'
    np.savez(path, x_train=np.zeros((2, 4, 4), np.uint8),
             y_train=np.array([3, 250]))
    with pytest.raises(ValueError, match='labels up to 250 but only 10 '
                       'class names'):
      sources.load_npz(path, class_names=tuple(str(i) for i in range(10)))


class TestLoadImageFolder:

  def _split_zip(self, tmp_path, make_image_zip, solid):
    return make_image_zip(
        tmp_path / 'tiny.zip',
        {
            'train/dog/0.png': solid(10),
            'train/cat/0.png': solid(20),
            'train/cat/1.png': solid(30),
            'test/dog/0.png': solid(40),
            'test/ant/0.png': solid(50),
        },
    )

  def test_split_zip(self, tmp_path, make_image_zip, solid):
    path = self._split_zip(tmp_path, make_image_zip, solid)
    d = sources.load_image_folder(path)
    assert d.name == 'tiny'
    assert d.class_names == ('ant', 'cat', 'dog')
    assert d.x_train.shape == (3, 6, 5, 3) and d.x_train.dtype == np.float32
    # Sorted member order: train/cat/0, train/cat/1, train/dog/0.
    np.testing.assert_array_equal(d.y_train, [1, 1, 2])
    np.testing.assert_allclose(d.x_train[:, 0, 0, 0] * 255, [20, 30, 10])
    np.testing.assert_array_equal(d.y_test, [0, 2])
    assert d.x_test.shape == (2, 6, 5, 3)

  def test_class_folders_in_directory(self, tmp_path, make_image_dir, solid):
    root = make_image_dir(
        tmp_path / 'imgs',
        {'b/x.png': solid(1), 'a/y.png': solid(2), 'a/.hidden.png': solid(3)},
    )
    d = sources.load_image_folder(root, use_cache=False)
    assert d.class_names == ('a', 'b')
    np.testing.assert_array_equal(d.y_train, [0, 1])
    assert d.x_test is None

  def test_wrapper_folder_is_ignored(self, tmp_path, make_image_zip, solid):
    path = make_image_zip(
        tmp_path / 'w.zip',
        {'neu/crazing/1.png': solid(1), 'neu/patches/2.png': solid(2)},
    )
    d = sources.load_image_folder(path, use_cache=False)
    assert d.class_names == ('crazing', 'patches')

  def test_resize_and_grayscale(self, tmp_path, make_image_zip, solid):
    path = make_image_zip(
        tmp_path / 'r.zip',
        {'a/0.png': solid(255, size=(10, 7)), 'b/0.png': solid(0, (3, 4))},
    )
    d = sources.load_image_folder(path, image_size=(4, 5), grayscale=True)
    assert d.x_train.shape == (2, 4, 5, 1)
    np.testing.assert_allclose(d.x_train[0], 1.0)
    d = sources.load_image_folder(path, image_size=3)
    assert d.x_train.shape == (2, 3, 3, 3)

  def test_different_sizes_need_image_size(
      self, tmp_path, make_image_zip, solid
  ):
    path = make_image_zip(
        tmp_path / 's.zip', {'a/0.png': solid(1, (4, 4)), 'b/0.png': solid(1)}
    )
    with pytest.raises(ValueError, match="'b/0.png'.*pass image_size"):
      sources.load_image_folder(path, use_cache=False)

  def test_no_class_folders(self, tmp_path, make_image_zip, solid):
    path = make_image_zip(tmp_path / 'flat.zip', {'0.png': solid(1)})
    with pytest.raises(ValueError, match='no class folders'):
      sources.load_image_folder(path)

  def test_no_images(self, tmp_path):
    path = tmp_path / 'empty.zip'
    with zipfile.ZipFile(path, 'w') as archive:
      archive.writestr('a/readme.txt', 'hi')
    with pytest.raises(ValueError, match='holds no image files'):
      sources.load_image_folder(path)

  def test_mixed_layout(self, tmp_path, make_image_zip, solid):
    path = make_image_zip(
        tmp_path / 'm.zip', {'train/a/0.png': solid(1), 'b/0.png': solid(1)}
    )
    with pytest.raises(ValueError, match='mixes folder layouts'):
      sources.load_image_folder(path)

  def test_corrupt_image(self, tmp_path, make_image_zip, solid):
    path = make_image_zip(
        tmp_path / 'c.zip', {'a/0.png': solid(1), 'a/1.jpg': b'not a jpeg'}
    )
    with pytest.raises(ValueError,
                       match="c.zip': Could not decode image 'a/1.jpg'"):
      sources.load_image_folder(path, use_cache=False)

  def test_not_a_zip(self, tmp_path):
    path = tmp_path / 'x.zip'
    path.write_text('hello')
    with pytest.raises(ValueError, match='neither a directory nor a zip'):
      sources.load_image_folder(path)

  def test_cache_is_used_and_invalidated(
      self, tmp_path, make_image_zip, solid, monkeypatch
  ):
    path = self._split_zip(tmp_path, make_image_zip, solid)
    cache = tmp_path / 'my_cache'
    first = sources.load_image_folder(path, cache_dir=cache)
    files = list(cache.glob('tiny-*.npz'))
    assert len(files) == 1
    assert not list(cache.glob('*.tmp'))

    def fail(*args, **kwargs):
      raise AssertionError('decoded although cached')

    monkeypatch.setattr(image_folder, '_decode_image', fail)
    second = sources.load_image_folder(path, cache_dir=cache)
    np.testing.assert_array_equal(first.x_train, second.x_train)
    np.testing.assert_array_equal(first.y_test, second.y_test)
    assert second.class_names == first.class_names
    # Other options or a changed file miss the cache.
    with pytest.raises(AssertionError, match='decoded although cached'):
      sources.load_image_folder(path, cache_dir=cache, grayscale=True)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    with pytest.raises(AssertionError, match='decoded although cached'):
      sources.load_image_folder(path, cache_dir=cache)

  def test_default_cache_dir_from_env(self, tmp_path, monkeypatch):
    monkeypatch.setenv('TFF_PFL_CACHE_DIR', str(tmp_path / 'env_cache'))
    assert sources.default_cache_dir() == tmp_path / 'env_cache'
    monkeypatch.delenv('TFF_PFL_CACHE_DIR')
    assert sources.default_cache_dir() == pathlib.Path(
        '~/.cache/tff_pfl'
    ).expanduser()

  def test_unreadable_cache_is_ignored(self, tmp_path, make_image_zip, solid):
    path = self._split_zip(tmp_path, make_image_zip, solid)
    cache = tmp_path / 'c'
    sources.load_image_folder(path, cache_dir=cache)
    (cache_file,) = cache.glob('*.npz')
    cache_file.write_bytes(b'garbage')
    d = sources.load_image_folder(path, cache_dir=cache)
    assert d.x_train.shape == (3, 6, 5, 3)

  @pytest.mark.parametrize('image_size', [0, (3,), (2, -1)])
  def test_bad_image_size(self, tmp_path, make_image_zip, solid, image_size):
    path = make_image_zip(tmp_path / 'a.zip', {'a/0.png': solid(1)})
    with pytest.raises(ValueError, match='image_size must be'):
      sources.load_image_folder(path, image_size=image_size)


_CSV = (
    '\ufeffname ,age,city, score,label\n'
    'a,30,paris,1.5,yes\n'
    'b,,rome,2.5,no\n'
    'c,50,,3.5,yes\n'
    'd,40,paris,,\n'
    'e,20,rome,0.5,maybe\n'
)


class TestLoadCsv:

  @pytest.fixture
  def csv_path(self, tmp_path):
    path = tmp_path / 'people.csv'
    path.write_text(_CSV, encoding='utf-8')
    return path

  def test_classification(self, csv_path):
    d = sources.load_csv(csv_path, target='label', drop=['name'])
    # The row without a label is dropped.
    assert d.x_train.shape[0] == 4
    assert d.class_names == ('maybe', 'no', 'yes')
    np.testing.assert_array_equal(d.y_train, [2, 1, 2, 0])
    assert d.feature_names == ('age', 'city=paris', 'city=rome', 'score')
    age = d.x_train[:, 0]
    # Missing age is imputed with the median (30) before standardising.
    assert age[1] == pytest.approx(age[0])
    np.testing.assert_allclose(d.x_train[:, [0, 3]].mean(axis=0), 0, atol=1e-6)
    # Missing city gives all-zero indicators.
    np.testing.assert_array_equal(d.x_train[:, 1:3], [[1, 0], [0, 1], [0, 0],
                                                      [0, 1]])
    assert d.x_test is None and d.name == 'people'

  def test_bom_and_padded_names(self, csv_path):
    d = sources.load_csv(csv_path, target=' label ', drop=(' name',))
    assert 'score' in d.feature_names

  def test_regression_and_forced_categorical(self, csv_path):
    d = sources.load_csv(
        csv_path,
        target='score',
        task='regression',
        categorical=['age'],
        drop=['name', 'label'],
        standardize=False,
    )
    np.testing.assert_allclose(d.y_train, [1.5, 2.5, 3.5, 0.5])
    assert d.y_train.dtype == np.float32 and d.num_classes == 0
    assert d.feature_names[:3] == ('age=20', 'age=30', 'age=50')

  def test_unknown_target_lists_columns(self, csv_path):
    with pytest.raises(ValueError, match=r"'target'.*\['name', 'age'"):
      sources.load_csv(csv_path, target='target')

  def test_a_binary_file_is_named(self, tmp_path):
    path = tmp_path / 'obesity.csv'
    path.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(ValueError,
                       match="obesity.csv' is not a readable UTF-8 CSV"):
      sources.load_csv(path, target='label')

  def test_unknown_drop(self, csv_path):
    with pytest.raises(ValueError, match=r"Cannot drop \['zip'\]"):
      sources.load_csv(csv_path, target='label', drop=['zip'])

  def test_non_numeric_regression_target(self, csv_path):
    with pytest.raises(ValueError, match='not numeric'):
      sources.load_csv(csv_path, target='city', task='regression')

  def test_bad_task(self, csv_path):
    with pytest.raises(ValueError, match='task must be one of'):
      sources.load_csv(csv_path, target='label', task='ranking')


class TestLoadTfds:

  def test_unknown_dataset(self, monkeypatch):
    tfds = pytest.importorskip('tensorflow_datasets')

    def fake_load(name, **kwargs):
      raise tfds.core.registered.DatasetNotFoundError(name)

    monkeypatch.setattr(tfds, 'load', fake_load)
    with pytest.raises(ValueError, match="does not know .* named 'nosuch'"):
      sources.load_tfds('nosuch')

  def test_offline_error_is_wrapped(self, monkeypatch, tmp_path):
    tfds = pytest.importorskip('tensorflow_datasets')

    def fake_load(name, **kwargs):
      raise ConnectionError('network is unreachable')

    monkeypatch.setattr(tfds, 'load', fake_load)
    with pytest.raises(FileNotFoundError, match=r"'cifar100'.*unreachable"):
      sources.load_tfds('cifar100', data_dir=tmp_path)

  def test_conversion(self, monkeypatch):
    tfds = pytest.importorskip('tensorflow_datasets')

    class FakeLabel:
      num_classes = 3
      names = ['a', 'b', 'c']

    class FakeInfo:
      features = {'label': FakeLabel()}

    def fake_load(name, split, **kwargs):
      assert name == 'fake'
      assert kwargs['as_supervised'] is False and kwargs['batch_size'] == -1
      def make(n):
        return {
            'image': np.full((n, 4, 4, 3), 255, np.uint8),
            'label': np.arange(n) % 3,
        }

      return [make(5), make(2)][: len(split)], FakeInfo()

    monkeypatch.setattr(tfds, 'load', fake_load)
    d = sources.load_tfds('fake')
    assert d.x_train.shape == (5, 4, 4, 3) and d.x_train.max() == 1.0
    assert d.x_test.shape == (2, 4, 4, 3)
    assert d.class_names == ('a', 'b', 'c')
    with pytest.raises(ValueError, match=r"no feature\(s\) \['fine'\]"):
      sources.load_tfds('fake', label_key='fine')


class TestSharedData:
  """Loaders on the real benchmark files (skipped when they are absent)."""

  def test_mnist(self, shared_file):
    d = sources.load_npz(shared_file('mnist.npz'))
    assert d.x_train.shape == (60000, 28, 28, 1)
    assert d.x_test.shape == (10000, 28, 28, 1)
    assert d.y_train.dtype == np.int64 and d.num_classes == 10
    assert d.x_train.dtype == np.float32 and d.x_train.max() == 1.0

  def test_mnistm_test_only(self, shared_file):
    d = sources.load_npz(shared_file('mnistm_test_32x32.npz'))
    assert d.x_train.shape == (9001, 32, 32, 3) and d.x_test is None

  def test_pneumoniamnist(self, shared_file):
    d = sources.load_npz(shared_file('pneumoniamnist_balanced_28px.npz'))
    assert d.x_train.shape == (2428 + 270, 28, 28, 1)
    assert d.x_test.shape == (468, 28, 28, 1) and d.num_classes == 2

  def test_neu_cls_small(self, shared_file, tmp_path):
    d = sources.load_image_folder(
        shared_file('neu_cls.zip'), image_size=32, cache_dir=tmp_path
    )
    assert d.x_train.shape == (1800, 32, 32, 3) and d.x_test is None
    assert d.class_names == (
        'crazing',
        'inclusion',
        'patches',
        'pitted_surface',
        'rolled-in_scale',
        'scratches',
    )
    np.testing.assert_array_equal(np.bincount(d.y_train), [300] * 6)

  def test_heart_disease_bom(self, shared_file):
    d = sources.load_csv(shared_file('heart_disease.csv'), target='target')
    assert d.feature_names[0] == 'age'  # Not '\ufeffage'.
    assert d.x_train.shape == (303, 13) and d.class_names == ('0', '1')

  def test_obesity(self, shared_file):
    d = sources.load_csv(shared_file('obesity.csv'), target='NObeyesdad')
    assert d.x_train.shape[0] == 2111 and d.num_classes == 7
    assert 'Gender=Female' in d.feature_names

  def test_life_expectancy_trailing_space(self, shared_file):
    d = sources.load_csv(
        shared_file('life_expectancy.csv'),
        target='Life expectancy',
        task='regression',
        drop=['Country'],
    )
    assert d.task == 'regression' and d.num_classes == 0
    assert d.x_train.shape[0] == len(d.y_train) > 2900
    assert not np.isnan(d.x_train).any()
    assert 40 < d.y_train.mean() < 90

  @pytest.mark.slow
  def test_cifar10_full(self, shared_file, tmp_path):
    start = time.time()
    d = sources.load_image_folder(
        shared_file('cifar10_jpeg.zip'), cache_dir=tmp_path
    )
    print(f'decoded CIFAR-10 in {time.time() - start:.1f}s')
    assert d.x_train.shape == (50000, 32, 32, 3)
    assert d.x_test.shape == (10000, 32, 32, 3)
    np.testing.assert_array_equal(np.bincount(d.y_test), [1000] * 10)
    assert d.class_names[0] == 'airplane' and d.class_names[-1] == 'truck'


def test_dataset_module_aliases():
  assert sources.ArrayDataset is dataset.ArrayDataset
