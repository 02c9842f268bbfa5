"""Tests for keras_models.resnet50."""

import pytest

from keras_models import registry
from keras_models import resnet50


def test_shapes_and_parameter_count():
  model = resnet50.build_resnet50((32, 32, 3))
  assert model.name == 'encoder'
  assert model.output_shape == (None, 2048)
  # Keras' ResNet50(include_top=False, pooling='avg').
  assert model.count_params() == 23_587_712


def test_bad_arguments():
  with pytest.raises(ValueError, match='offline'):
    resnet50.build_resnet50((32, 32, 3), weights='imagenet')
  with pytest.raises(ValueError, match=r'resnet50: .*at least 32'):
    resnet50.build_resnet50((16, 16, 3))
  with pytest.raises(ValueError, match='resnet50: expects an input_shape'):
    resnet50.build_resnet50((32, 32))


def test_one_gradient_step_changes_weights(classification_step):
  model = registry.build_model('resnet50', (32, 32, 3), 3)
  changed = classification_step(model, (32, 32, 3), 3)
  assert all(changed)
