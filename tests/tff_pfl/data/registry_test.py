"""Tests for tff_pfl.data.registry."""

import pathlib
import re

import numpy as np
import pytest

from tff_pfl.data import registry
from tff_pfl.data import sources

_EXPECTED_FILES = {
    'mnist': 'mnist.npz',
    'mnistm': 'mnistm_test_32x32.npz',
    'pneumoniamnist': 'pneumoniamnist_balanced_28px.npz',
    'neu_cls': 'neu_cls.zip',
    'cifar10': 'cifar10_jpeg.zip',
    'obesity': 'obesity.csv',
    'heart_disease': 'heart_disease.csv',
    'life_expectancy': 'life_expectancy.csv',
}


def test_list_datasets():
  listing = {name: (desc, needs) for name, desc, needs in
             registry.list_datasets()}
  for name in ('digits', 'iris', 'wine', 'breast_cancer', 'cifar100'):
    assert listing[name][1] is False
  for name, file_name in _EXPECTED_FILES.items():
    assert listing[name][1] is True
    assert registry.DATASETS[name].file_name == file_name
  assert all(desc for desc, _ in listing.values())


def test_unknown_name_lists_known():
  with pytest.raises(ValueError, match=r"'imagenet'.*'mnist'.*tfds:"):
    registry.load_dataset('imagenet')
  # Checked without loading: programs check names before anything runs.
  registry.check_name('mnist')
  registry.check_name('tfds:cifar100')
  for bad in ('imagenet', 'tfds:'):
    with pytest.raises(ValueError, match=re.escape(repr(bad))):
      registry.check_name(bad)


def test_missing_file_names_full_path(tmp_path):
  expected = str(tmp_path / 'mnist.npz')
  with pytest.raises(FileNotFoundError) as info:
    registry.load_dataset('mnist', data_dir=tmp_path)
  message = str(info.value)
  assert expected in message
  assert 'keras.datasets.mnist' in message and 'TFF_PFL_DATA_DIR' in message


def test_data_dir_from_env(tmp_path, monkeypatch):
  np.savez(
      tmp_path / 'mnist.npz',
      x_train=np.zeros((3, 2, 2), np.uint8),
      y_train=np.array([0, 1, 9]),
  )
  monkeypatch.setenv('TFF_PFL_DATA_DIR', str(tmp_path))
  assert registry.default_data_dir() == tmp_path
  d = registry.load_dataset('mnist')
  assert d.name == 'mnist' and d.x_train.shape == (3, 2, 2, 1)


def test_default_data_dir_beside_repo(monkeypatch):
  monkeypatch.delenv('TFF_PFL_DATA_DIR', raising=False)
  repo_root = pathlib.Path(registry.__file__).resolve().parents[2]
  assert registry.default_data_dir() == (
      repo_root.parent / 'shared' / 'data'
  ).resolve()


def test_sklearn_without_files(tmp_path):
  d = registry.load_dataset('digits', data_dir=tmp_path / 'nowhere')
  assert d.x_train.shape == (1797, 8, 8, 1)
  d = registry.load_dataset('iris', standardize=False)
  assert d.x_train.mean() > 1.0


def test_unknown_option():
  with pytest.raises(ValueError, match=r"\['image_size'\].*'digits'"):
    registry.load_dataset('digits', image_size=3)


def test_neu_cls_options(tmp_path, make_image_zip, solid):
  make_image_zip(
      tmp_path / 'neu_cls.zip',
      {
          'crazing/1.jpg': solid(1, (20, 20)),
          'patches/1.jpg': solid(9, (20, 20)),
      },
  )
  d = registry.load_dataset('neu_cls', data_dir=tmp_path)
  assert d.name == 'neu_cls' and d.x_train.shape == (2, 64, 64, 3)
  d = registry.load_dataset(
      'neu_cls', data_dir=tmp_path, image_size=8, grayscale=True
  )
  assert d.x_train.shape == (2, 8, 8, 1)


def test_tfds_routes(monkeypatch, tmp_path):
  calls = []

  def fake_load_tfds(name, **kwargs):
    calls.append((name, kwargs))
    return 'loaded'

  monkeypatch.setattr(sources, 'load_tfds', fake_load_tfds)
  assert registry.load_dataset('tfds:svhn_cropped', data_dir=tmp_path,
                               split_test=None) == 'loaded'
  assert registry.load_dataset('cifar100', label_key='coarse_label') == (
      'loaded'
  )
  assert calls == [
      ('svhn_cropped', dict(data_dir=tmp_path, split_test=None)),
      ('cifar100', dict(data_dir=None, label_key='coarse_label')),
  ]
  with pytest.raises(ValueError, match='tfds:<name>'):
    registry.load_dataset('tfds:')


class TestSharedData:
  """The registry against the real benchmark folder (skipped if absent)."""

  def test_expected_files_present(self, shared_dir):
    missing = [
        f for f in _EXPECTED_FILES.values() if not (shared_dir / f).exists()
    ]
    assert not missing

  @pytest.mark.parametrize(
      'name, num_examples, num_classes, task',
      [
          ('mnistm', 9001, 10, 'classification'),
          ('pneumoniamnist', 2428 + 270 + 468, 2, 'classification'),
          ('obesity', 2111, 7, 'classification'),
          ('heart_disease', 303, 2, 'classification'),
          ('life_expectancy', 2928, 0, 'regression'),
      ],
  )
  def test_load(self, shared_dir, name, num_examples, num_classes, task):
    d = registry.load_dataset(name, data_dir=shared_dir)
    assert d.num_examples == num_examples
    assert d.num_classes == num_classes and d.task == task

  def test_pneumonia_class_names(self, shared_dir):
    d = registry.load_dataset('pneumoniamnist', data_dir=shared_dir)
    assert d.class_names == ('normal', 'pneumonia')

  def test_life_expectancy_drops_country(self, shared_dir):
    d = registry.load_dataset('life_expectancy', data_dir=shared_dir)
    assert not any(f.startswith('Country') for f in d.feature_names)
    assert 'Status=Developing' in d.feature_names
    kept = registry.load_dataset(
        'life_expectancy', data_dir=shared_dir, drop=()
    )
    assert any(f.startswith('Country=') for f in kept.feature_names)

  def test_neu_cls(self, shared_dir, tmp_path):
    d = registry.load_dataset(
        'neu_cls', data_dir=shared_dir, image_size=32, cache_dir=tmp_path
    )
    assert d.x_train.shape == (1800, 32, 32, 3) and d.num_classes == 6
