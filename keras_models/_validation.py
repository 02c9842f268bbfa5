"""Argument checks shared by the encoder and head builders.

Every builder validates its arguments eagerly, before any Keras layer is
created, so that a misconfigured experiment fails with a message that names
the model and the problem instead of a shape error deep inside Keras.
"""

from collections.abc import Sequence
import math
import numbers
import os
from typing import Any, Optional, Union

# A spatial operation for `min_spatial_size`: ('conv', kernel, stride, pad) or
# ('pool', size, stride, pad), where `pad` is the total zero padding added on
# one axis (0 for 'valid'). Output size is floor((n + pad - k) / stride) + 1.
SpatialOp = tuple[str, int, int, int]

WeightsArg = Union[None, str, os.PathLike]


def check_input_shape(
    model_name: str, input_shape: Any, rank: int
) -> tuple[int, ...]:
  """Checks that `input_shape` is `rank` positive integers (no batch dim).

  Args:
    model_name: Name of the model being built, used in error messages.
    input_shape: The per-example input shape, e.g. `(32, 32, 3)`.
    rank: The required number of dimensions, e.g. 3 for `(H, W, C)` images.

  Returns:
    The shape as a tuple of Python ints.

  Raises:
    ValueError: If the shape is not a sequence of `rank` positive integers.
  """
  expected = {1: '(num_features,)', 3: '(height, width, channels)'}.get(
      rank, ''
  )
  if isinstance(input_shape, (str, bytes)):
    raise ValueError(
        f'{model_name}: input_shape must be a sequence of {rank} ints '
        f'{expected}, got the string {input_shape!r}.'
    )
  try:
    dims = tuple(input_shape)
  except TypeError:
    raise ValueError(
        f'{model_name}: input_shape must be a sequence of {rank} ints '
        f'{expected}, got {input_shape!r}.'
    ) from None
  if len(dims) != rank:
    raise ValueError(
        f'{model_name}: expects an input_shape of rank {rank} {expected} '
        f'without the batch dimension, got {dims!r} (rank {len(dims)}).'
    )
  result = []
  for dim in dims:
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral):
      raise ValueError(
          f'{model_name}: every input_shape dimension must be a positive '
          f'int, got {dims!r}.'
      )
    if dim <= 0:
      raise ValueError(
          f'{model_name}: every input_shape dimension must be positive, got '
          f'{dims!r}.'
      )
    result.append(int(dim))
  return tuple(result)


def spatial_output_size(size: int, ops: Sequence[SpatialOp]) -> int:
  """Returns the side length after applying `ops` to a side of `size`.

  Args:
    size: Input side length.
    ops: Spatial operations, see `SpatialOp`.

  Returns:
    The output side length; 0 or negative when the input is too small.
  """
  for _, kernel, stride, pad in ops:
    if size + pad < kernel:
      return 0
    size = (size + pad - kernel) // stride + 1
  return size


def min_spatial_size(ops: Sequence[SpatialOp]) -> int:
  """Returns the smallest side length for which `ops` yield a side >= 1.

  Args:
    ops: Spatial operations, see `SpatialOp`.

  Returns:
    The minimal input side length.
  """
  size = 1
  while spatial_output_size(size, ops) < 1:
    size += 1
  return size


def check_spatial_size(
    model_name: str,
    input_shape: tuple[int, ...],
    min_size: int,
    reason: str,
) -> None:
  """Raises if the height or width of `input_shape` is below `min_size`.

  Args:
    model_name: Name of the model being built, used in error messages.
    input_shape: A validated `(height, width, channels)` tuple.
    min_size: The minimal height and width.
    reason: Why the minimum exists, appended to the error message.

  Raises:
    ValueError: If height or width is smaller than `min_size`.
  """
  height, width = input_shape[0], input_shape[1]
  if height < min_size or width < min_size:
    raise ValueError(
        f'{model_name}: input height and width must be at least {min_size} '
        f'({reason}), got input_shape={input_shape!r}.'
    )


def check_positive_int(model_name: str, option: str, value: Any) -> int:
  """Returns `value` as an int, raising ValueError unless it is positive.

  Args:
    model_name: Name of the model being built, used in error messages.
    option: Name of the option being checked.
    value: The value to check.

  Returns:
    `value` as a Python int.

  Raises:
    ValueError: If `value` is not a positive integer.
  """
  if (
      isinstance(value, bool)
      or not isinstance(value, numbers.Integral)
      or value <= 0
  ):
    raise ValueError(
        f'{model_name}: {option} must be a positive int, got {value!r}.'
    )
  return int(value)


def check_int_sequence(
    model_name: str, option: str, value: Any, allow_empty: bool = False
) -> tuple[int, ...]:
  """Returns `value` as a tuple of positive ints.

  Args:
    model_name: Name of the model being built, used in error messages.
    option: Name of the option being checked.
    value: A sequence of positive ints (a single int is also accepted).
    allow_empty: Whether an empty sequence is valid.

  Returns:
    The values as a tuple of Python ints.

  Raises:
    ValueError: If `value` is not a (non-empty) sequence of positive ints.
  """
  if isinstance(value, numbers.Integral) and not isinstance(value, bool):
    value = (value,)
  if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
    raise ValueError(
        f'{model_name}: {option} must be a sequence of positive ints, got '
        f'{value!r}.'
    )
  if not value and not allow_empty:
    raise ValueError(f'{model_name}: {option} must not be empty.')
  return tuple(check_positive_int(model_name, option, v) for v in value)


def check_positive_float(model_name: str, option: str, value: Any) -> float:
  """Returns `value` as a float, raising ValueError unless finite and > 0.

  Args:
    model_name: Name of the model being built, used in error messages.
    option: Name of the option being checked.
    value: The value to check.

  Returns:
    `value` as a Python float.

  Raises:
    ValueError: If `value` is not a finite positive real number.
  """
  if (
      isinstance(value, bool)
      or not isinstance(value, numbers.Real)
      or not math.isfinite(value)
      or value <= 0
  ):
    raise ValueError(
        f'{model_name}: {option} must be a positive number, got {value!r}.'
    )
  return float(value)


def check_rate(model_name: str, option: str, value: Any) -> float:
  """Returns `value` as a float, raising ValueError unless in [0, 1).

  Args:
    model_name: Name of the model being built, used in error messages.
    option: Name of the option being checked.
    value: The value to check, e.g. a dropout rate.

  Returns:
    `value` as a Python float.

  Raises:
    ValueError: If `value` is not a real number in [0, 1).
  """
  if (
      isinstance(value, bool)
      or not isinstance(value, numbers.Real)
      or not 0.0 <= value < 1.0
  ):
    raise ValueError(
        f'{model_name}: {option} must be a number in [0, 1), got {value!r}.'
    )
  return float(value)


def check_local_weights(model_name: str, weights: Any) -> Optional[str]:
  """Checks a `weights` option of a `tf.keras.applications` model.

  This library runs offline, so only `None` (random initialization) or the
  path of an existing local weights file are accepted.

  Args:
    model_name: Name of the model being built, used in error messages.
    weights: `None` or a path to a local weights file.

  Returns:
    `None` or the path as a string.

  Raises:
    ValueError: If `weights` is anything else, e.g. `'imagenet'`, or names a
      file that does not exist.
  """
  if weights is None:
    return None
  if isinstance(weights, (str, os.PathLike)):
    path = os.fspath(weights)
    if os.path.isfile(path):
      return path
    if path == 'imagenet':
      raise ValueError(
          f"{model_name}: weights='imagenet' would download pretrained "
          'weights, which is impossible offline. Pass weights=None, or the '
          'path of a local weights file (e.g. a .h5 file saved beforehand).'
      )
    raise ValueError(
        f'{model_name}: weights must be None or the path of an existing local '
        f'weights file (nothing can be downloaded offline); {path!r} is not '
        'a file.'
    )
  raise ValueError(
      f'{model_name}: weights must be None or the path of an existing local '
      f'weights file (nothing can be downloaded offline), got {weights!r}.'
  )
