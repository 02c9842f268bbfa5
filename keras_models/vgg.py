"""VGG-11 encoder (Simonyan & Zisserman, 2015, configuration "A").

Convolutional configuration `[64, M, 128, M, 256, 256, M, 512, 512, M, 512,
512, M]`, each width times `width` (rounded, at least 1): 3x3 'same'
convolutions with bias and ReLU (optionally conv -> batch norm -> ReLU, as
torchvision's `vgg11_bn`), `M` a 2x2 max-pool. The final map is flattened
when it is 1x1 (e.g. 32x32 inputs) and globally average pooled otherwise,
giving `round(512 * width)` features; an optional ReLU dense layer of
`hidden` units follows. At `width=1` the convolutional part has 9,220,480
parameters, like torchvision's `vgg11().features`.
"""

from collections.abc import Sequence
from typing import Optional, Union

import tensorflow as tf

from keras_models import _validation
from keras_models import batch_norm as batch_norm_lib

VGG11_CONFIG: tuple[Union[int, str], ...] = (
    64, 'M', 128, 'M', 256, 256, 'M', 512, 512, 'M', 512, 512, 'M'
)

_SPATIAL_OPS = tuple(('pool', 2, 2, 0) for v in VGG11_CONFIG if v == 'M')

# Smallest height/width leaving a >= 1x1 map after the five max-pools.
MIN_INPUT_SIZE = _validation.min_spatial_size(_SPATIAL_OPS)


def build_vgg11(
    input_shape: Sequence[int],
    *,
    batch_norm: bool = False,
    hidden: Optional[int] = None,
    bn_momentum: float = batch_norm_lib.DEFAULT_MOMENTUM,
    width: float = 1.0,
) -> tf.keras.Model:
  """Builds a VGG-11 encoder.

  Args:
    input_shape: `(height, width, channels)` of one example, at least 32x32.
    batch_norm: Whether to add batch normalization after each convolution.
    bn_momentum: Momentum of its moving statistics; 0.9 (PyTorch's 0.1)
      instead of Keras' 0.99, see `keras_models.batch_norm`.
    hidden: Units of an optional ReLU dense layer after the pooled features;
      `None` (default) adds none.
    width: Multiplier of the convolution widths 64/128/256/512 (each
      rounded, at least 1), as ResNet's `width`: e.g. 0.25 for a narrow
      VGG-11 that 2 CPU cores can train in a reduced grid.

  Returns:
    A functional `tf.keras.Model` named 'encoder' with output
    `[batch, round(512 * width)]`, or `[batch, hidden]` when `hidden` is
    set.

  Raises:
    ValueError: If `input_shape` is not `(height, width, channels)` with sides
      of at least 32, or an option has an invalid value.
  """
  name = 'vgg11'
  shape = _validation.check_input_shape(name, input_shape, rank=3)
  _validation.check_spatial_size(
      name, shape, MIN_INPUT_SIZE, 'five 2x2 max-pools'
  )
  if not isinstance(batch_norm, bool):
    raise ValueError(f'{name}: batch_norm must be a bool, got {batch_norm!r}.')
  if hidden is not None:
    hidden = _validation.check_positive_int(name, 'hidden', hidden)
  bn_momentum = _validation.check_rate(name, 'bn_momentum', bn_momentum)
  width = _validation.check_positive_float(name, 'width', width)

  inputs = tf.keras.Input(shape=shape, name='image')
  x = inputs
  conv_index = pool_index = 0
  for value in VGG11_CONFIG:
    if value == 'M':
      pool_index += 1
      x = tf.keras.layers.MaxPool2D(2, name=f'pool{pool_index}')(x)
      continue
    conv_index += 1
    x = tf.keras.layers.Conv2D(
        max(1, int(round(value * width))), 3, padding='same',
        name=f'conv{conv_index}'
    )(x)
    if batch_norm:
      x = tf.keras.layers.BatchNormalization(
          momentum=bn_momentum, name=f'bn{conv_index}'
      )(x)
    x = tf.keras.layers.ReLU(name=f'relu{conv_index}')(x)
  if x.shape[1] == 1 and x.shape[2] == 1:
    x = tf.keras.layers.Flatten(name='flatten')(x)
  else:
    x = tf.keras.layers.GlobalAveragePooling2D(name='avg_pool')(x)
  if hidden is not None:
    x = tf.keras.layers.Dense(hidden, activation='relu', name='fc1')(x)
  return tf.keras.Model(inputs, x, name='encoder')
