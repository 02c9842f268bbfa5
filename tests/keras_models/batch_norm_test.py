"""Tests for keras_models.batch_norm and the encoders' `bn_momentum`."""

import numpy as np
import pytest
import tensorflow as tf

from keras_models import batch_norm
from keras_models import registry

# Every encoder with batch normalization, with small options.
_BN_ENCODERS = {
    'mobilenet_v2': ((32, 32, 3), {'alpha': 0.35}),
    'resnet10': ((32, 32, 3), {}),
    'resnet18': ((32, 32, 3), {}),
    'resnet50': ((32, 32, 3), {}),
    'vgg11': ((32, 32, 3), {'batch_norm': True}),
}


def _momenta(model):
  return {layer.momentum for layer in model.submodules
          if isinstance(layer, tf.keras.layers.BatchNormalization)}


@pytest.mark.parametrize('name', sorted(_BN_ENCODERS))
def test_every_encoder_uses_the_shared_momentum(name):
  shape, options = _BN_ENCODERS[name]
  assert _momenta(registry.ENCODERS[name](shape, **options)) == {
      batch_norm.DEFAULT_MOMENTUM}


@pytest.mark.parametrize('name', ['mobilenet_v2', 'resnet50', 'vgg11'])
def test_bn_momentum_option(name):
  shape, options = _BN_ENCODERS[name]
  model = registry.ENCODERS[name](shape, bn_momentum=0.99, **options)
  assert _momenta(model) == {0.99}
  # The momentum survives the config round trip (models are cloned).
  clone = tf.keras.models.clone_model(model)
  assert _momenta(clone) == {0.99}
  with pytest.raises(ValueError, match=f'{name}: bn_momentum must be a '
                     r'number in \[0, 1\), got 1.5'):
    registry.ENCODERS[name](shape, bn_momentum=1.5, **options)


def _inference_accuracy_after_fitting(bn_momentum):
  """Fits a MobileNetV2 classifier to 6 images in 120 one-batch steps (the
  local steps of a 40-round AFedCL cell with 5 samples per client) and
  returns its accuracy on those same images in training mode and in
  inference mode."""
  tf.keras.utils.set_random_seed(0)
  rng = np.random.default_rng(0)
  x = rng.normal(size=(6, 64, 64, 3)).astype('float32')
  y = np.array([0, 1] * 3)
  x[y == 1, :32] += 1.0
  encoder = registry.ENCODERS['mobilenet_v2'](
      (64, 64, 3), alpha=0.35, bn_momentum=bn_momentum)
  model = tf.keras.Sequential([encoder, tf.keras.layers.Dense(2)])
  model.compile(tf.keras.optimizers.Adam(1e-3),
                tf.keras.losses.SparseCategoricalCrossentropy(
                    from_logits=True))
  model.fit(x, y, batch_size=8, epochs=120, verbose=0)
  accuracy = lambda training: float(np.mean(
      np.argmax(model(x, training=training), axis=1) == y))
  return accuracy(True), accuracy(False)


@pytest.mark.slow   # ~90 s of MobileNetV2 training; the default itself is
                    # checked by test_every_encoder_uses_the_shared_momentum
def test_few_steps_leave_keras_default_statistics_unusable():
  # With the shared momentum the moving statistics have converged: the
  # model classifies its own training images in inference mode.
  assert _inference_accuracy_after_fitting(batch_norm.DEFAULT_MOMENTUM) == (
      1.0, 1.0)
  # With Keras' MobileNetV2 default (0.999) it fits them in training mode
  # but is at chance in inference mode (the reason for the default).
  train, infer = _inference_accuracy_after_fitting(0.999)
  assert train == 1.0 and infer <= 0.5 + 1e-6
