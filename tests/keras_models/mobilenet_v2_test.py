"""Tests for keras_models.mobilenet_v2."""

import numpy as np
import pytest
import tensorflow as tf

from keras_models import mobilenet_v2
from keras_models import registry


def test_alpha_1_shapes_and_parameter_count():
  model = mobilenet_v2.build_mobilenet_v2((32, 32, 3))
  assert model.name == 'encoder'
  assert model.output_shape == (None, 1280)
  # Keras' MobileNetV2(alpha=1.0, include_top=False); pooling adds none.
  assert model.count_params() == 2_257_984
  assert sum(int(tf.size(v)) for v in model.trainable_variables) == 2_223_872
  assert model(tf.zeros((2, 32, 32, 3))).shape == (2, 1280)


def test_local_weights_file_is_loaded(tmp_path):
  source = mobilenet_v2.build_mobilenet_v2((32, 32, 3), alpha=0.35)
  path = tmp_path / 'mobilenet_v2_035.h5'
  source.save_weights(str(path))
  tf.keras.utils.set_random_seed(1)
  loaded = mobilenet_v2.build_mobilenet_v2(
      (32, 32, 3), alpha=0.35, weights=path
  )
  assert len(loaded.weights) == len(source.weights)
  for expected, actual in zip(source.weights, loaded.weights):
    np.testing.assert_array_equal(actual.numpy(), expected.numpy())


@pytest.mark.parametrize('weights', ['imagenet', 'missing.h5', 3])
def test_unavailable_weights_are_rejected(weights):
  with pytest.raises(ValueError, match='offline'):
    mobilenet_v2.build_mobilenet_v2((32, 32, 3), weights=weights)


def test_bad_input_shape():
  with pytest.raises(ValueError, match='mobilenet_v2: expects an input_shape'):
    mobilenet_v2.build_mobilenet_v2((3072,))
  with pytest.raises(ValueError, match=r'mobilenet_v2: .*at least 32'):
    mobilenet_v2.build_mobilenet_v2((28, 28, 1))
  with pytest.raises(ValueError, match='alpha'):
    mobilenet_v2.build_mobilenet_v2((32, 32, 3), alpha=0)


def test_one_gradient_step_changes_weights(classification_step):
  model = registry.build_model(
      'mobilenet_v2', (32, 32, 3), 4, encoder_options={'alpha': 0.35}
  )
  changed = classification_step(model, (32, 32, 3), 4)
  unchanged = [
      v.name for v, c in zip(model.trainable_variables, changed) if not c
  ]
  # A 'project_BN' beta adds a per-channel constant that the next 1x1
  # convolution maps to a constant, which the following batch norm (batch
  # statistics in training mode) subtracts again: its gradient is zero in
  # exact arithmetic, and exactly zero here where the maps are 1x1.
  assert all('_project_BN/beta' in name for name in unchanged), unchanged
  assert len(unchanged) < len(changed) // 10
