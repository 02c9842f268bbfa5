"""ResNet-10 and ResNet-18 encoders built from BasicBlocks (He et al., 2016).

Keras ships no BasicBlock ResNets, so they are written here to mirror the
PyTorch reference implementations that personalized FL papers use:

*   `small_input=True` (CIFAR-style, the common choice for 32x32 images): a
    3x3 stride-1 stem convolution and no max-pool, as in the widely used
    CIFAR ResNet-18 (`kuangliu/pytorch-cifar`).
*   `small_input=False` (ImageNet-style, `torchvision.models.resnet18`): a 7x7
    stride-2 stem convolution followed by a 3x3 stride-2 max-pool.

Then four stages of BasicBlocks with 64, 128, 256 and 512 filters (times
`width`); stages 2 to 4 halve the resolution in their first block, whose
shortcut is then a 1x1 convolution followed by batch normalization. Strided
3x3 convolutions use explicit symmetric zero padding of 1 (PyTorch's
`padding=1`) instead of Keras' asymmetric 'same' padding, so feature-map sizes
and alignment match the reference for every input size. Convolutions have no
bias (each is followed by batch normalization); batch normalization uses
PyTorch's defaults (momentum 0.1, i.e. Keras momentum 0.9, epsilon 1e-5).
The encoder ends with global average pooling, so its output is
`[batch, 512 * width]`; the fully connected classifier is a separate head.
"""

from collections.abc import Sequence
from typing import Optional

import tensorflow as tf

from keras_models import _validation
from keras_models import batch_norm as batch_norm_lib

# Input sides up to this value default to the CIFAR-style stem.
SMALL_INPUT_MAX_SIDE = 64

_BASE_WIDTHS = (64, 128, 256, 512)
_BN_MOMENTUM = batch_norm_lib.DEFAULT_MOMENTUM
_BN_EPSILON = 1e-5


def _conv(
    x: tf.Tensor, filters: int, kernel: int, stride: int, name: str
) -> tf.Tensor:
  """A bias-free convolution with PyTorch-style symmetric padding."""
  if stride == 1:
    padding = 'same'
  else:
    padding = 'valid'
    pad = (kernel - 1) // 2
    if pad:
      x = tf.keras.layers.ZeroPadding2D(pad, name=f'{name}_pad')(x)
  return tf.keras.layers.Conv2D(
      filters,
      kernel,
      strides=stride,
      padding=padding,
      use_bias=False,
      kernel_initializer='he_normal',
      name=name,
  )(x)


def _batch_norm(x: tf.Tensor, name: str) -> tf.Tensor:
  return tf.keras.layers.BatchNormalization(
      momentum=_BN_MOMENTUM, epsilon=_BN_EPSILON, name=name
  )(x)


def _basic_block(
    x: tf.Tensor, filters: int, stride: int, name: str
) -> tf.Tensor:
  """Two 3x3 convolutions with an identity or projection shortcut."""
  in_filters = x.shape[-1]
  y = _conv(x, filters, 3, stride, name=f'{name}_conv1')
  y = _batch_norm(y, name=f'{name}_bn1')
  y = tf.keras.layers.ReLU(name=f'{name}_relu1')(y)
  y = _conv(y, filters, 3, 1, name=f'{name}_conv2')
  y = _batch_norm(y, name=f'{name}_bn2')
  if stride != 1 or in_filters != filters:
    shortcut = _conv(x, filters, 1, stride, name=f'{name}_shortcut_conv')
    shortcut = _batch_norm(shortcut, name=f'{name}_shortcut_bn')
  else:
    shortcut = x
  y = tf.keras.layers.Add(name=f'{name}_add')([y, shortcut])
  return tf.keras.layers.ReLU(name=f'{name}_out')(y)


def build_resnet(
    input_shape: Sequence[int],
    blocks_per_stage: Sequence[int],
    *,
    small_input: Optional[bool] = None,
    width: float = 1.0,
    model_name: str = 'resnet',
) -> tf.keras.Model:
  """Builds a BasicBlock ResNet encoder with global average pooling.

  Args:
    input_shape: `(height, width, channels)` of one example.
    blocks_per_stage: Number of BasicBlocks in each of the four stages, e.g.
      `(2, 2, 2, 2)` for ResNet-18.
    small_input: Whether to use the CIFAR-style 3x3 stride-1 stem without
      max-pool (True) or the ImageNet-style 7x7 stride-2 stem with a 3x3
      stride-2 max-pool (False). Defaults to True when the smaller of height
      and width is at most `SMALL_INPUT_MAX_SIDE` (64).
    width: Multiplier of the stage widths 64/128/256/512 (each rounded to an
      int, at least 1).
    model_name: Name used in error messages, e.g. 'resnet18'.

  Returns:
    A functional `tf.keras.Model` named 'encoder' mapping
    `[batch, *input_shape]` to `[batch, round(512 * width)]`.

  Raises:
    ValueError: If `input_shape` is not `(height, width, channels)` of positive
      ints, or an option has an invalid value.
  """
  shape = _validation.check_input_shape(model_name, input_shape, rank=3)
  blocks = _validation.check_int_sequence(
      model_name, 'blocks_per_stage', blocks_per_stage
  )
  if len(blocks) != len(_BASE_WIDTHS):
    raise ValueError(
        f'{model_name}: blocks_per_stage must have {len(_BASE_WIDTHS)} '
        f'entries, got {blocks!r}.'
    )
  width = _validation.check_positive_float(model_name, 'width', width)
  if small_input is None:
    small_input = min(shape[0], shape[1]) <= SMALL_INPUT_MAX_SIDE
  elif not isinstance(small_input, bool):
    raise ValueError(
        f'{model_name}: small_input must be None or a bool, got '
        f'{small_input!r}.'
    )
  widths = [max(1, int(round(w * width))) for w in _BASE_WIDTHS]

  inputs = tf.keras.Input(shape=shape, name='image')
  if small_input:
    x = _conv(inputs, widths[0], 3, 1, name='stem_conv')
    x = _batch_norm(x, name='stem_bn')
    x = tf.keras.layers.ReLU(name='stem_relu')(x)
  else:
    x = _conv(inputs, widths[0], 7, 2, name='stem_conv')
    x = _batch_norm(x, name='stem_bn')
    x = tf.keras.layers.ReLU(name='stem_relu')(x)
    # Zero padding before the max-pool is harmless after the ReLU, and
    # matches PyTorch's `MaxPool2d(3, stride=2, padding=1)`.
    x = tf.keras.layers.ZeroPadding2D(1, name='stem_pool_pad')(x)
    x = tf.keras.layers.MaxPool2D(3, strides=2, name='stem_pool')(x)
  for stage, (num_blocks, filters) in enumerate(zip(blocks, widths), start=1):
    for block in range(1, num_blocks + 1):
      stride = 2 if stage > 1 and block == 1 else 1
      x = _basic_block(x, filters, stride, name=f'stage{stage}_block{block}')
  outputs = tf.keras.layers.GlobalAveragePooling2D(name='avg_pool')(x)
  return tf.keras.Model(inputs, outputs, name='encoder')


def build_resnet18(
    input_shape: Sequence[int],
    *,
    small_input: Optional[bool] = None,
    width: float = 1.0,
) -> tf.keras.Model:
  """Builds a ResNet-18 encoder (BasicBlocks, stages of [2, 2, 2, 2]).

  See the module docstring for the architecture. With `width=1.0` and the
  CIFAR-style stem it has 11,168,832 trainable parameters, the same as the
  common PyTorch CIFAR ResNet-18 without its fully connected layer.

  Args:
    input_shape: `(height, width, channels)` of one example.
    small_input: CIFAR-style stem if True, ImageNet-style if False; defaults
      to True when height or width is at most 64.
    width: Multiplier of the stage widths 64/128/256/512.

  Returns:
    A functional `tf.keras.Model` named 'encoder' with output
    `[batch, 512 * width]`.

  Raises:
    ValueError: If `input_shape` or an option is invalid.
  """
  return build_resnet(
      input_shape,
      (2, 2, 2, 2),
      small_input=small_input,
      width=width,
      model_name='resnet18',
  )


def build_resnet10(
    input_shape: Sequence[int],
    *,
    small_input: Optional[bool] = None,
    width: float = 1.0,
) -> tf.keras.Model:
  """Builds a ResNet-10 encoder (BasicBlocks, stages of [1, 1, 1, 1]).

  See the module docstring for the architecture.

  Args:
    input_shape: `(height, width, channels)` of one example.
    small_input: CIFAR-style stem if True, ImageNet-style if False; defaults
      to True when height or width is at most 64.
    width: Multiplier of the stage widths 64/128/256/512.

  Returns:
    A functional `tf.keras.Model` named 'encoder' with output
    `[batch, 512 * width]`.

  Raises:
    ValueError: If `input_shape` or an option is invalid.
  """
  return build_resnet(
      input_shape,
      (1, 1, 1, 1),
      small_input=small_input,
      width=width,
      model_name='resnet10',
  )
