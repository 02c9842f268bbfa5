"""Loads images stored one class per folder (directory or .zip), cached.

Decoding tens of thousands of JPEGs takes a while, so decoded uint8 arrays
are cached as .npz files (see `load_image_folder`).
"""

from collections.abc import Sequence
import hashlib
import io
import json
import logging
import os
import pathlib
import re
import tempfile
from typing import Any, Optional, Union
import zipfile

import numpy as np

from tff_pfl.data import dataset

_IMAGE_EXTENSIONS = frozenset(
    ['.jpg', '.jpeg', '.png', '.bmp', '.gif', '.tif', '.tiff', '.webp']
)
_SPLIT_DIRS = ('train', 'test')
# Bump when the layout of image-folder cache files changes.
_CACHE_FORMAT_VERSION = 1

def default_cache_dir() -> pathlib.Path:
  """`$TFF_PFL_CACHE_DIR` if set, else ~/.cache/tff_pfl."""
  env = os.environ.get('TFF_PFL_CACHE_DIR')
  if env:
    return pathlib.Path(env).expanduser()
  return pathlib.Path('~/.cache/tff_pfl').expanduser()


def _normalize_image_size(
    image_size: Union[None, int, Sequence[int]],
) -> Optional[tuple[int, int]]:
  if image_size is None:
    return None
  if isinstance(image_size, (int, np.integer)):
    size = (int(image_size), int(image_size))
  else:
    size = tuple(int(s) for s in image_size)
  if len(size) != 2 or min(size) < 1:
    raise ValueError(
        f'image_size must be a positive int or (height, width), got '
        f'{image_size!r}.'
    )
  return size


def _is_image_member(rel: str) -> bool:
  parts = rel.split('/')
  if any(p.startswith('.') or p == '__MACOSX' for p in parts):
    return False
  return pathlib.PurePosixPath(rel).suffix.lower() in _IMAGE_EXTENSIONS


class _ImageSource:
  """Lists and reads image files from a directory or a zip archive."""

  def __init__(self, path: pathlib.Path):
    self.path = path
    self._zip = None
    if path.is_dir():
      members = [
          p.relative_to(path).as_posix()
          for p in path.rglob('*')
          if p.is_file()
      ]
    elif zipfile.is_zipfile(path):
      # Closed by close(); pylint: disable-next=consider-using-with
      self._zip = zipfile.ZipFile(path)
      members = [i.filename for i in self._zip.infolist() if not i.is_dir()]
    else:
      raise ValueError(
          f'{str(path)!r} is neither a directory nor a zip archive of images.'
      )
    self.members = sorted(m for m in members if _is_image_member(m))

  def read(self, member: str) -> bytes:
    """The raw bytes of `member` (a path relative to the source)."""
    if self._zip is not None:
      return self._zip.read(member)
    return (self.path / member).read_bytes()

  def fingerprint(self) -> list[Any]:
    """Size and mtime of the source, used to key the decode cache."""
    stat = self.path.stat()
    if self._zip is not None:
      return [str(self.path.resolve()), stat.st_size, stat.st_mtime_ns]
    entries = []
    for member in self.members:
      s = (self.path / member).stat()
      entries.append([member, s.st_size, s.st_mtime_ns])
    return [str(self.path.resolve()), entries]

  def close(self):
    """Closes the zip archive, if any."""
    if self._zip is not None:
      self._zip.close()


def _layout(
    members: Sequence[str], path: pathlib.Path
) -> dict[str, list[tuple[str, str]]]:
  """Maps split -> [(member, class name)] for the folder layouts we accept."""
  parts = [m.split('/') for m in members]
  # Strip one shared wrapper folder, e.g. 'neu_cls/<class>/<file>'.
  while (
      parts
      and all(len(p) >= 3 for p in parts)
      and len({p[0] for p in parts}) == 1
      and parts[0][0] not in _SPLIT_DIRS
  ):
    parts = [p[1:] for p in parts]
  nested = [p for p in parts if len(p) >= 2]
  if not nested:
    raise ValueError(
        f'{str(path)!r} has no class folders: expected images laid out as '
        '<class>/<file> or train|test/<class>/<file>, found '
        f'{len(members)} image file(s) and no folders.'
    )
  if all(len(p) == 3 and p[0] in _SPLIT_DIRS for p in parts):
    layout = {split: [] for split in _SPLIT_DIRS}
    for member, p in zip(members, parts):
      layout[p[0]].append((member, p[1]))
    if not layout['train']:
      raise ValueError(
          f'{str(path)!r} has a test/ folder but no train/ folder.'
      )
    return layout
  if all(len(p) == 2 for p in parts):
    return {'train': [(m, p[0]) for m, p in zip(members, parts)]}
  odd = next(
      m for m, p in zip(members, parts) if len(p) != 2 or p[0] in _SPLIT_DIRS
  )
  raise ValueError(
      f'{str(path)!r} mixes folder layouts (e.g. {odd!r}); expected every '
      'image at <class>/<file> or every image at train|test/<class>/<file>.'
  )


def _decode_image(
    data: bytes,
    member: str,
    size: Optional[tuple[int, int]],
    grayscale: bool,
) -> np.ndarray:
  # pylint: disable-next=import-outside-toplevel
  from PIL import Image

  try:
    with Image.open(io.BytesIO(data)) as image:
      image = image.convert('L' if grayscale else 'RGB')
      if size is not None and image.size != (size[1], size[0]):
        image = image.resize((size[1], size[0]), Image.Resampling.BILINEAR)
      array = np.asarray(image, dtype=np.uint8)
  except Exception as e:  # PIL raises several unrelated types.
    raise ValueError(f'Could not decode image {member!r}: {e}') from e
  if grayscale:
    array = array[..., np.newaxis]
  return array


def _decode_split(
    source: _ImageSource,
    items: Sequence[tuple[str, str]],
    class_index: dict[str, int],
    size: Optional[tuple[int, int]],
    grayscale: bool,
) -> tuple[np.ndarray, np.ndarray]:
  """Decodes `items` into a uint8 [N, H, W, C] array and int64 labels."""
  images = None
  labels = np.empty(len(items), dtype=np.int64)
  for i, (member, class_name) in enumerate(items):
    array = _decode_image(source.read(member), member, size, grayscale)
    if images is None:
      images = np.empty((len(items),) + array.shape, dtype=np.uint8)
    elif array.shape != images.shape[1:]:
      raise ValueError(
          f'Image {member!r} has shape {array.shape} but earlier images have '
          f'{images.shape[1:]}; pass image_size to resize them all.'
      )
    images[i] = array
    labels[i] = class_index[class_name]
  return images, labels


def _read_cache(cache_file: pathlib.Path) -> Optional[dict[str, np.ndarray]]:
  try:
    with np.load(cache_file, allow_pickle=False) as data:
      return {k: data[k] for k in data.files}
  except FileNotFoundError:
    return None
  except Exception as e:  # pylint: disable=broad-except
    logging.warning('Ignoring unreadable cache file %s: %s', cache_file, e)
    return None


def _write_cache(cache_file: pathlib.Path, arrays: dict[str, np.ndarray]):
  """Writes `arrays` to `cache_file` atomically; failures only warn."""
  tmp_name = None
  try:
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(
        dir=cache_file.parent, suffix='.tmp', delete=False
    ) as f:
      tmp_name = f.name
      np.savez(f, **arrays)
    os.replace(tmp_name, cache_file)
  except OSError as e:
    logging.warning('Could not write cache file %s: %s', cache_file, e)
    if tmp_name is not None and os.path.exists(tmp_name):
      os.remove(tmp_name)


def load_image_folder(
    path: dataset.PathLike,
    *,
    image_size: Union[None, int, Sequence[int]] = None,
    grayscale: bool = False,
    name: Optional[str] = None,
    cache_dir: Optional[dataset.PathLike] = None,
    use_cache: bool = True,
) -> dataset.ArrayDataset:
  """Loads images stored one class per folder, from a directory or a .zip.

  Accepted layouts (a single wrapper folder around them is ignored):
  `<class>/<file>` gives only a training split; `train/<class>/<file>` plus
  optional `test/<class>/<file>` gives both splits. Class indices follow the
  sorted class folder names across both splits. Files are read in sorted
  path order, hidden files and `__MACOSX` are skipped.

  Decoding many JPEGs is slow (about 10 s for the 60,000 CIFAR-10 JPEGs on
  one CPU core), so the decoded uint8 arrays are cached as an .npz under
  `cache_dir`, keyed by the source's path, size and modification time (for a
  directory: of every image file) and by `image_size`/`grayscale`. The cache
  is written atomically; a stale or unreadable cache file is ignored.

  Args:
    path: A directory or a .zip archive.
    image_size: If set, resize every image (bilinear) to this size: an int
      for square images or (height, width). Without it every image must
      already have the same size.
    grayscale: Convert to one channel; otherwise images are converted to RGB.
    name: Data set name; defaults to the file or folder name without
      extension.
    cache_dir: Where to cache decoded arrays; defaults to
      `$TFF_PFL_CACHE_DIR` or ~/.cache/tff_pfl.
    use_cache: Set to False to neither read nor write the cache.

  Returns:
    An `ArrayDataset` of float32 images in [0, 1], shape [N, H, W, C].

  Raises:
    FileNotFoundError: If `path` does not exist.
    ValueError: If there are no class folders, the layout is mixed, an
      image cannot be decoded, or sizes differ without `image_size`.
  """
  path = dataset.existing_path(path)
  name = name or path.name.split('.')[0]
  size = _normalize_image_size(image_size)
  source = _ImageSource(path)
  try:
    if not source.members:
      raise ValueError(
          f'{str(path)!r} holds no image files (extensions '
          f'{sorted(_IMAGE_EXTENSIONS)}); expected <class>/<file> or '
          'train|test/<class>/<file>.'
      )
    layout = _layout(source.members, path)
    class_names = tuple(
        sorted({c for items in layout.values() for _, c in items})
    )
    cache_file = None
    arrays = None
    if use_cache:
      key = json.dumps(
          [
              _CACHE_FORMAT_VERSION,
              source.fingerprint(),
              size,
              bool(grayscale),
          ],
          sort_keys=True,
      )
      digest = hashlib.sha256(key.encode('utf-8')).hexdigest()[:20]
      cache_root = (
          pathlib.Path(cache_dir).expanduser()
          if cache_dir is not None
          else default_cache_dir()
      )
      safe_name = re.sub(r'[^A-Za-z0-9_.-]', '_', name)
      cache_file = cache_root / f'{safe_name}-{digest}.npz'
      arrays = _read_cache(cache_file)
    if arrays is None:
      class_index = {c: i for i, c in enumerate(class_names)}
      arrays = {}
      for split, items in layout.items():
        if items:
          try:
            x, y = _decode_split(source, items, class_index, size,
                                 grayscale)
          except ValueError as e:   # name the archive, not only the member
            raise ValueError(f'{str(path)!r}: {e}') from e
          arrays[f'x_{split}'] = x
          arrays[f'y_{split}'] = y
      if cache_file is not None:
        _write_cache(cache_file, arrays)
  finally:
    source.close()

  def images(key):
    if key not in arrays:
      return None
    return arrays[key].astype(np.float32) / np.float32(255.0)

  return dataset.ArrayDataset(
      name=name,
      x_train=images('x_train'),
      y_train=arrays['y_train'],
      x_test=images('x_test'),
      y_test=arrays.get('y_test'),
      num_classes=len(class_names),
      class_names=class_names,
      task=dataset.CLASSIFICATION,
  )
