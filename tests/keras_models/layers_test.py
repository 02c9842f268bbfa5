"""Tests for keras_models.layers (gradient reversal, seeded dropout)."""

import numpy as np
import pytest
import tensorflow as tf

from keras_models import heads
from keras_models import layers


@pytest.mark.parametrize('lambda_', [0.0, 0.5, 1.0, 2.5])
def test_forward_identity_and_reversed_gradient(lambda_):
  layer = layers.GradientReversal(lambda_)
  x = tf.constant(np.random.default_rng(0).normal(size=(3, 4)), tf.float32)
  upstream = tf.constant(
      np.random.default_rng(1).normal(size=(3, 4)), tf.float32
  )
  with tf.GradientTape() as tape:
    tape.watch(x)
    y = layer(x)
  np.testing.assert_array_equal(y.numpy(), x.numpy())
  grad = tape.gradient(y, x, output_gradients=upstream)
  np.testing.assert_allclose(grad.numpy(), -lambda_ * upstream.numpy())


def test_gradient_in_tf_function_and_float64():
  @tf.function
  def grad_of_sum(x):
    with tf.GradientTape() as tape:
      tape.watch(x)
      loss = tf.reduce_sum(layers.reverse_gradient(x, 3.0))
    return tape.gradient(loss, x)

  x = tf.constant([1.0, -2.0], tf.float64)
  grad = grad_of_sum(x)
  assert grad.dtype == tf.float64
  np.testing.assert_array_equal(grad.numpy(), [-3.0, -3.0])


def test_reverses_encoder_gradient_of_discriminator_loss():
  encoder = tf.keras.Sequential([tf.keras.layers.Dense(4)])
  disc = heads.build_discriminator(4, hidden=8)
  x = tf.ones((2, 3))

  def encoder_grads(grl):
    with tf.GradientTape() as tape:
      features = encoder(x)
      if grl is not None:
        features = grl(features)
      loss = tf.reduce_sum(disc(features))
    return tape.gradient(loss, encoder.trainable_variables)

  plain = encoder_grads(None)
  reversed_ = encoder_grads(layers.GradientReversal(0.5))
  for g_plain, g_rev in zip(plain, reversed_):
    np.testing.assert_allclose(g_rev.numpy(), -0.5 * g_plain.numpy(), 1e-6)


def test_config_round_trip():
  layer = layers.GradientReversal(0.25, name='grl')
  config = layer.get_config()
  assert config['lambda_'] == 0.25
  assert config['name'] == 'grl'
  clone = layers.GradientReversal.from_config(config)
  assert clone.lambda_ == 0.25
  # Registered as 'keras_models>GradientReversal': deserializable without
  # custom_objects, also inside a functional model.
  inputs = tf.keras.Input((3,))
  model = tf.keras.Model(inputs, layer(inputs))
  rebuilt = tf.keras.Model.from_config(model.get_config())
  assert rebuilt.layers[-1].lambda_ == 0.25
  assert isinstance(rebuilt.layers[-1], layers.GradientReversal)


@pytest.mark.parametrize('lambda_', [float('nan'), float('inf'), '1', True])
def test_bad_lambda(lambda_):
  with pytest.raises(ValueError, match='lambda_'):
    layers.GradientReversal(lambda_)


def _ones(shape=(64, 32)):
  return tf.ones(shape, tf.float32)


def test_seeded_dropout_drops_at_rate_and_scales_only_in_training():
  layer = layers.SeededDropout(0.25, seed=3)
  x = _ones()
  np.testing.assert_array_equal(layer(x), x)            # inference
  np.testing.assert_array_equal(layer(x, training=False), x)
  y = layer(x, training=True).numpy()
  assert set(np.unique(y)) == {0.0, np.float32(1 / 0.75)}
  assert abs((y == 0).mean() - 0.25) < 0.03            # 2048 units
  # A tensor `training` (as Keras passes in some paths) works too.
  np.testing.assert_array_equal(layer(x, training=tf.constant(False)), x)
  np.testing.assert_array_equal(layer(x, training=tf.constant(True)), y)
  np.testing.assert_array_equal(layers.SeededDropout(0.0)(x, training=True),
                                x)


def test_seeded_dropout_mask_is_a_function_of_seed_and_input():
  layer = layers.SeededDropout(0.5, seed=1)
  x = _ones()
  first = layer(x, training=True).numpy()
  np.testing.assert_array_equal(layer(x, training=True), first)
  # Another layer with the same seed, in a tf.function: the same mask.
  same = tf.function(lambda v: layers.SeededDropout(0.5, seed=1)(
      v, training=True))
  np.testing.assert_array_equal(same(x), first)
  # Another input or another seed draws another mask.
  other_input = layer(x * 2.0, training=True).numpy() / 2.0
  assert not np.array_equal(other_input, first)
  other_seed = layers.SeededDropout(0.5, seed=2)(x, training=True).numpy()
  assert not np.array_equal(other_seed, first)


def test_seeded_dropout_gradient_is_the_scaled_mask():
  layer = layers.SeededDropout(0.5, seed=0)
  x = tf.constant(np.random.default_rng(0).normal(size=(8, 16)), tf.float32)
  with tf.GradientTape() as tape:
    tape.watch(x)
    y = layer(x, training=True)
  grad = tape.gradient(y, x).numpy()
  np.testing.assert_allclose(grad, np.where(y.numpy() != 0, 2.0, 0.0))


def test_seeded_dropout_config_round_trip_and_bad_values():
  layer = layers.SeededDropout(0.3, seed=7, name='drop')
  clone = layers.SeededDropout.from_config(layer.get_config())
  assert (clone.rate, clone.seed, clone.name) == (0.3, 7, 'drop')
  for rate in (1.0, -0.1, True, 'half'):
    with pytest.raises(ValueError, match='SeededDropout: rate must be'):
      layers.SeededDropout(rate)
  with pytest.raises(ValueError, match='SeededDropout: seed must be an int'):
    layers.SeededDropout(0.5, seed=1.5)
