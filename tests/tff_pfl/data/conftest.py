"""Fixtures for the tff_pfl.data tests: shared data and tiny image archives."""

import io
import os
import pathlib
import zipfile

import numpy as np
import pytest

_REPO_ROOT = pathlib.Path(__file__).resolve().parents[3]


def shared_data_dir() -> pathlib.Path:
  """`$TFF_PFL_DATA_DIR`, else `<repo root>/../shared/data`."""
  env = os.environ.get('TFF_PFL_DATA_DIR')
  if env:
    return pathlib.Path(env)
  return _REPO_ROOT.parent / 'shared' / 'data'


@pytest.fixture
def shared_file():
  """Returns a function giving the path of a shared data file, or skipping."""

  def get(file_name: str) -> pathlib.Path:
    path = shared_data_dir() / file_name
    if not path.exists():
      pytest.skip(
          f'shared data file {path} is absent (set TFF_PFL_DATA_DIR to the '
          'folder holding the benchmark data to run this test)'
      )
    return path

  return get


@pytest.fixture
def shared_dir() -> pathlib.Path:
  """The shared data folder; skips the test when it is absent."""
  path = shared_data_dir()
  if not path.is_dir():
    pytest.skip(
        f'shared data folder {path} is absent (set TFF_PFL_DATA_DIR to run '
        'this test)'
    )
  return path


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
  """Keeps image-folder caches out of the user's home directory."""
  monkeypatch.setenv('TFF_PFL_CACHE_DIR', str(tmp_path / 'cache'))


def _solid(value: int, size=(6, 5), channels: int = 3) -> np.ndarray:
  shape = tuple(size) + ((channels,) if channels > 1 else ())
  return np.full(shape, value, dtype=np.uint8)


def _encode(array: np.ndarray, fmt: str) -> bytes:
  from PIL import Image  # pylint: disable=import-outside-toplevel

  buffer = io.BytesIO()
  Image.fromarray(array).save(buffer, format=fmt)
  return buffer.getvalue()


@pytest.fixture
def solid():
  """Returns `solid(value, size=(6, 5), channels=3)`: a uint8 flat image."""
  return _solid


@pytest.fixture
def make_image_zip():
  """Returns `make(path, {member: uint8 image or raw bytes})` writing a zip.

  Arrays are stored as PNG (lossless, so pixel values survive).
  """

  def make(path: pathlib.Path, files: dict) -> pathlib.Path:
    with zipfile.ZipFile(path, 'w') as archive:
      for name, content in files.items():
        if isinstance(content, np.ndarray):
          content = _encode(content, 'PNG')
        archive.writestr(name, content)
    return path

  return make


@pytest.fixture
def make_image_dir():
  """Returns `make(root, {relative path: uint8 image})` writing PNG files."""

  def make(root: pathlib.Path, files: dict) -> pathlib.Path:
    for name, array in files.items():
      path = root / name
      path.parent.mkdir(parents=True, exist_ok=True)
      path.write_bytes(_encode(array, 'PNG'))
    return root

  return make
