"""Tests for tff_pfl.core.model_spec.ModelSpec.architecture."""

import collections

import tensorflow as tf

from keras_models import registry
from tff_pfl.core import model_spec

from tests.tff_pfl import conftest as helpers


def _encoder_spec(name, **options):
  """A spec whose model is a registry encoder (32x32x3) plus a dense head."""
  def keras_model_fn():
    return tf.keras.Sequential([
        registry.ENCODERS[name]((32, 32, 3), **options),
        tf.keras.layers.Dense(3)])
  return model_spec.ModelSpec(
      keras_model_fn,
      collections.OrderedDict(x=tf.TensorSpec([None, 32, 32, 3]),
                              y=tf.TensorSpec([None], tf.int64)),
      'classification', 3)


def test_architecture_ignores_layer_names_and_session_counters():
  spec = helpers.make_spec(batch_norm=True)
  first = spec.architecture()
  # Keras numbers layers per session (dense_3, dense_4, ...): other builds
  # in between must not change the hash.
  for _ in range(3):
    spec.keras_model_fn()
  assert spec.architecture() == first
  assert len(first) == 16


def _feature_spec(*layers_fn):
  """A spec on the test features: `layers_fn()` gives the hidden layers,
  built anew for each model, then a dense head."""
  def keras_model_fn():
    return tf.keras.Sequential(
        [tf.keras.layers.InputLayer((helpers.NUM_FEATURES,))]
        + [make() for make in layers_fn]
        + [tf.keras.layers.Dense(helpers.NUM_CLASSES)])
  return model_spec.ModelSpec(
      keras_model_fn,
      collections.OrderedDict(
          x=tf.TensorSpec([None, helpers.NUM_FEATURES]),
          y=tf.TensorSpec([None], tf.int64)),
      'classification', helpers.NUM_CLASSES)


def _small_spec(momentum=0.9, rate=0.1, units=4):
  """A small model with batch norm and dropout (fast to build)."""
  return _feature_spec(
      lambda: tf.keras.layers.Dense(units),
      lambda: tf.keras.layers.BatchNormalization(momentum=momentum),
      lambda: tf.keras.layers.Dropout(rate))


def test_architecture_changes_with_settings_that_change_no_shape():
  plain = _small_spec().architecture()
  assert plain == _small_spec().architecture()
  assert plain != _small_spec(momentum=0.999).architecture()
  assert plain != _small_spec(rate=0.2).architecture()
  # And with the shapes: another width, another layer.
  assert plain != _small_spec(units=5).architecture()
  assert (helpers.make_spec(batch_norm=True).architecture()
          != helpers.make_spec(batch_norm=False).architecture())
  # A registry encoder's option reaches it (Keras' MobileNetV2 momentum).
  assert (_encoder_spec('mobilenet_v2', alpha=0.35).architecture()
          != _encoder_spec('mobilenet_v2', alpha=0.35,
                           bn_momentum=0.999).architecture())


def test_architecture_of_a_lambda_layer_names_its_function():
  def spec(fn):
    return _feature_spec(lambda: tf.keras.layers.Lambda(fn))

  def double(x):
    return 2 * x

  def halve(x):
    return x / 2

  assert spec(double).architecture() == spec(double).architecture()
  assert spec(double).architecture() != spec(halve).architecture()
