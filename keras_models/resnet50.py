"""ResNet-50 encoder from `tf.keras.applications` (He et al., 2016).

The network is used without its classification top and with global average
pooling, so its output is `[batch, 2048]`. Only random initialization or a
local weights file are supported: this library runs offline and never
downloads pretrained weights.
"""

from collections.abc import Sequence

import tensorflow as tf

from keras_models import _validation
from keras_models import batch_norm

# `tf.keras.applications` rejects inputs smaller than 32x32.
MIN_INPUT_SIZE = 32


def build_resnet50(
    input_shape: Sequence[int],
    *,
    weights: _validation.WeightsArg = None,
    bn_momentum: float = batch_norm.DEFAULT_MOMENTUM,
) -> tf.keras.Model:
  """Builds a ResNet-50 encoder with global average pooling.

  The encoder has 23,587,712 parameters (23,534,592 trainable).

  Args:
    input_shape: `(height, width, channels)` of one example; height and width
      must be at least 32.
    weights: `None` for random initialization, or the path of a local weights
      file for `tf.keras.applications.ResNet50(include_top=False)`.
    bn_momentum: Momentum of the batch-normalization moving statistics; 0.9
      instead of Keras' 0.99, see `keras_models.batch_norm`.

  Returns:
    A functional `tf.keras.Model` named 'encoder' with output `[batch, 2048]`.

  Raises:
    ValueError: If `input_shape` is not `(height, width, channels)` with sides
      of at least 32, `bn_momentum` is not in [0, 1), or `weights` is neither
      `None` nor an existing local file (e.g. 'imagenet', which needs a
      download).
  """
  name = 'resnet50'
  shape = _validation.check_input_shape(name, input_shape, rank=3)
  _validation.check_spatial_size(
      name, shape, MIN_INPUT_SIZE, 'tf.keras.applications minimum'
  )
  weights = _validation.check_local_weights(name, weights)
  base = tf.keras.applications.ResNet50(
      input_shape=shape,
      include_top=False,
      weights=weights,
      pooling='avg',
  )
  batch_norm.set_momentum(name, base, bn_momentum)
  return tf.keras.Model(base.input, base.output, name='encoder')
