"""The in-memory data set type shared by all loaders.

Conventions every `ArrayDataset` follows:

*   Images are float32 in [0, 1], laid out HWC with an explicit channel axis
    (grayscale images have shape (H, W, 1)).
*   Tabular features are float32.
*   Classification labels are int64 in [0, num_classes); regression targets
    are float32 and `num_classes` is 0.
*   `x_test`/`y_test` are None when the source has no test split; callers
    then split per client (see `tff_pfl.data.partition`).
"""

import dataclasses
import os
import pathlib
from typing import Any, Optional, Union

import numpy as np

PathLike = Union[str, os.PathLike]

CLASSIFICATION = 'classification'
REGRESSION = 'regression'
TASKS = (CLASSIFICATION, REGRESSION)


@dataclasses.dataclass(frozen=True)
class ArrayDataset:
  """An in-memory data set with an optional test split.

  Attributes:
    name: A short name, e.g. 'mnist'.
    x_train: Features, float32, shape [N, ...].
    y_train: Labels, int64 (classification) or float32 (regression), [N].
    x_test: Test features or None when the source has no test split.
    y_test: Test labels or None (exactly when `x_test` is None).
    num_classes: Number of classes; 0 for regression.
    class_names: One name per class; () for regression.
    task: 'classification' or 'regression'.
    feature_names: Column names for tabular data; () for images.
  """

  name: str
  x_train: np.ndarray
  y_train: np.ndarray
  x_test: Optional[np.ndarray]
  y_test: Optional[np.ndarray]
  num_classes: int
  class_names: tuple[str, ...]
  task: str
  feature_names: tuple[str, ...] = ()

  def __post_init__(self):
    if self.task not in TASKS:
      raise ValueError(
          f'Dataset {self.name!r}: task must be one of {TASKS}, got '
          f'{self.task!r}.'
      )
    if (self.x_test is None) != (self.y_test is None):
      raise ValueError(
          f'Dataset {self.name!r}: x_test and y_test must both be set or both '
          'be None.'
      )
    # Normalise dtypes; frozen dataclasses need object.__setattr__.
    for split in ('train', 'test'):
      x = getattr(self, f'x_{split}')
      y = getattr(self, f'y_{split}')
      if x is None:
        continue
      x, y = self._checked_arrays(split, x, y)
      object.__setattr__(self, f'x_{split}', x)
      object.__setattr__(self, f'y_{split}', y)
    if (
        self.x_test is not None
        and self.x_test.shape[1:] != self.x_train.shape[1:]
    ):
      raise ValueError(
          f'Dataset {self.name!r}: x_test has per-example shape '
          f'{self.x_test.shape[1:]} but x_train has {self.x_train.shape[1:]}.'
      )
    object.__setattr__(self, 'class_names', tuple(self.class_names))
    object.__setattr__(self, 'feature_names', tuple(self.feature_names))
    if self.task == CLASSIFICATION:
      if self.num_classes < 1:
        raise ValueError(
            f'Dataset {self.name!r}: a classification data set needs '
            f'num_classes >= 1, got {self.num_classes}.'
        )
      if len(self.class_names) != self.num_classes:
        raise ValueError(
            f'Dataset {self.name!r}: {len(self.class_names)} class names for '
            f'{self.num_classes} classes.'
        )
    elif self.num_classes != 0 or self.class_names:
      raise ValueError(
          f'Dataset {self.name!r}: a regression data set must have '
          f'num_classes=0 and no class names, got {self.num_classes}.'
      )
    if self.feature_names and (
        self.x_train.ndim != 2
        or len(self.feature_names) != self.x_train.shape[1]
    ):
      raise ValueError(
          f'Dataset {self.name!r}: {len(self.feature_names)} feature names '
          f'for features of shape {self.x_train.shape[1:]}.'
      )

  def _checked_arrays(
      self, split: str, x: Any, y: Any
  ) -> tuple[np.ndarray, np.ndarray]:
    """Validates one split and returns it with the documented dtypes."""
    x = np.asarray(x)
    y = np.asarray(y)
    if x.ndim < 2:
      raise ValueError(
          f'Dataset {self.name!r}: x_{split} must have shape [N, ...], got '
          f'{x.shape}.'
      )
    if y.ndim != 1:
      raise ValueError(
          f'Dataset {self.name!r}: y_{split} must have shape [N], got '
          f'{y.shape}.'
      )
    if len(x) != len(y):
      raise ValueError(
          f'Dataset {self.name!r}: x_{split} has {len(x)} examples but '
          f'y_{split} has {len(y)}.'
      )
    if not np.issubdtype(x.dtype, np.floating):
      raise ValueError(
          f'Dataset {self.name!r}: x_{split} has dtype {x.dtype}; features '
          'must be floating point (convert uint8 images to float32 in [0, 1]).'
      )
    x = x.astype(np.float32, copy=False)
    if np.isnan(x).any():
      raise ValueError(f'Dataset {self.name!r}: x_{split} contains NaN.')
    if self.task == CLASSIFICATION:
      if not np.issubdtype(y.dtype, np.integer):
        raise ValueError(
            f'Dataset {self.name!r}: classification labels y_{split} must be '
            f'integers, got dtype {y.dtype}.'
        )
      y = y.astype(np.int64, copy=False)
      if len(y) and (y.min() < 0 or y.max() >= self.num_classes):
        raise ValueError(
            f'Dataset {self.name!r}: y_{split} has labels in '
            f'[{y.min()}, {y.max()}], outside [0, {self.num_classes}).'
        )
    else:
      y = y.astype(np.float32, copy=False)
      if np.isnan(y).any():
        raise ValueError(
            f'Dataset {self.name!r}: regression targets y_{split} contain NaN.'
        )
    return x, y

  @property
  def input_shape(self) -> tuple[int, ...]:
    """The shape of one example, e.g. (28, 28, 1)."""
    return tuple(self.x_train.shape[1:])

  @property
  def num_examples(self) -> int:
    """The number of examples in train and test together."""
    n_test = 0 if self.x_test is None else len(self.x_test)
    return len(self.x_train) + n_test

  def pooled(self) -> tuple[np.ndarray, np.ndarray]:
    """Returns (x, y) with the train examples followed by the test ones.

    Per-client partitions are made over the pooled arrays; sample index i
    refers to row i of the result.
    """
    if self.x_test is None:
      return self.x_train, self.y_train
    return (
        np.concatenate([self.x_train, self.x_test]),
        np.concatenate([self.y_train, self.y_test]),
    )


def existing_path(path: PathLike) -> pathlib.Path:
  """Returns `path` as a Path, raising FileNotFoundError if it is missing."""
  path = pathlib.Path(path).expanduser()
  if not path.exists():
    raise FileNotFoundError(f'No such file or directory: {str(path)!r}')
  return path


def images_to_float(images: np.ndarray, key: str) -> np.ndarray:
  """Converts uint8 (or [0, 1] float) images to float32 with a channel axis.

  Args:
    images: Array of shape [N, H, W] or [N, H, W, C].
    key: Name of the array, used in error messages.

  Returns:
    float32 images in [0, 1], shape [N, H, W, C].

  Raises:
    ValueError: For other dtypes, floats outside [0, 1] or another rank.
  """
  if images.dtype == np.uint8:
    images = images.astype(np.float32) / np.float32(255.0)
  elif np.issubdtype(images.dtype, np.floating):
    images = images.astype(np.float32, copy=False)
    if images.size and (images.min() < 0.0 or images.max() > 1.0):
      raise ValueError(
          f'Array {key!r} holds floats outside [0, 1] '
          f'([{images.min()}, {images.max()}]); expected uint8 images or '
          'floats in [0, 1].'
      )
  else:
    raise ValueError(
        f'Array {key!r} has dtype {images.dtype}; expected uint8 images or '
        'floats in [0, 1].'
    )
  if images.ndim not in (3, 4):
    raise ValueError(
        f'Array {key!r} has shape {images.shape}; expected images '
        '[N, H, W] or [N, H, W, C].'
    )
  if images.ndim == 3:
    images = images[..., np.newaxis]
  return images


def integer_labels(labels: np.ndarray, key: str) -> np.ndarray:
  """Flattens (N, 1) labels to (N,) and returns them as int64.

  Args:
    labels: Array of shape [N] or [N, 1].
    key: Name of the array, used in error messages.

  Returns:
    int64 labels of shape [N].

  Raises:
    ValueError: For other shapes or non-integer values.
  """
  if labels.ndim == 2 and labels.shape[1] == 1:
    labels = labels[:, 0]
  if labels.ndim != 1:
    raise ValueError(
        f'Array {key!r} must have shape (N,) or (N, 1), got {labels.shape}.'
    )
  if not np.issubdtype(labels.dtype, np.integer):
    if not np.all(np.equal(np.mod(labels, 1), 0)):
      raise ValueError(f'Array {key!r} holds non-integer labels.')
  return labels.astype(np.int64)
