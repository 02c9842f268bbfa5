"""MobileNetV2 encoder from `tf.keras.applications` (Sandler et al., 2018).

The network is used without its classification top and followed by global
average pooling, so its output is a `[batch, feature_dim]` vector with
`feature_dim = 1280` for `alpha <= 1.0` (1280 * alpha, rounded, above 1.0).
Only random initialization or a local weights file are supported: this
library runs offline and never downloads pretrained weights.
"""

from collections.abc import Sequence

import tensorflow as tf

from keras_models import _validation
from keras_models import batch_norm

# `tf.keras.applications` rejects inputs smaller than 32x32.
MIN_INPUT_SIZE = 32


def build_mobilenet_v2(
    input_shape: Sequence[int],
    *,
    alpha: float = 1.0,
    weights: _validation.WeightsArg = None,
    bn_momentum: float = batch_norm.DEFAULT_MOMENTUM,
) -> tf.keras.Model:
  """Builds a MobileNetV2 encoder with global average pooling.

  With `alpha=1.0` the encoder has 2,257,984 parameters (2,223,872
  trainable); the pooling adds none.

  Args:
    input_shape: `(height, width, channels)` of one example; height and width
      must be at least 32. Small inputs such as 32x32 work with random
      initialization.
    alpha: Width multiplier of the network (`alpha` of
      `tf.keras.applications.MobileNetV2`).
    weights: `None` for random initialization, or the path of a local weights
      file for `tf.keras.applications.MobileNetV2(include_top=False)` with
      the same `alpha` (e.g. saved with `save_weights('....h5')`).
    bn_momentum: Momentum of the batch-normalization moving statistics; 0.9
      instead of Keras' 0.999, see `keras_models.batch_norm`.

  Returns:
    A functional `tf.keras.Model` named 'encoder'.

  Raises:
    ValueError: If `input_shape` is not `(height, width, channels)` with sides
      of at least 32, `alpha` is not positive, `bn_momentum` is not in
      [0, 1), or `weights` is neither `None` nor an existing local file (e.g.
      'imagenet', which needs a download).
  """
  name = 'mobilenet_v2'
  shape = _validation.check_input_shape(name, input_shape, rank=3)
  _validation.check_spatial_size(
      name, shape, MIN_INPUT_SIZE, 'tf.keras.applications minimum'
  )
  alpha = _validation.check_positive_float(name, 'alpha', alpha)
  weights = _validation.check_local_weights(name, weights)
  base = tf.keras.applications.MobileNetV2(
      input_shape=shape,
      alpha=alpha,
      include_top=False,
      weights=weights,
  )
  batch_norm.set_momentum(name, base, bn_momentum)
  outputs = tf.keras.layers.GlobalAveragePooling2D(name='avg_pool')(
      base.output
  )
  return tf.keras.Model(base.input, outputs, name='encoder')
