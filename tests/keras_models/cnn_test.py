"""Tests for keras_models.cnn (SimpleCNN and FedAvgCNN encoders)."""

import pytest
import tensorflow as tf

from keras_models import cnn
from keras_models import registry


@pytest.mark.parametrize(
    'input_shape, expected',
    [
        # PFLlib FedAvgCNN (encoder + 10-class linear head):
        # conv1 5*5*1*32+32 = 832, conv2 5*5*32*64+64 = 51,264,
        # fc1 (4*4*64)*512+512 = 524,800, fc 512*10+10 = 5,130.
        ((28, 28, 1), 582_026),
        # conv1 5*5*3*32+32 = 2,432, fc1 (5*5*64)*512+512 = 819,712.
        ((32, 32, 3), 878_538),
    ],
)
def test_fedavg_cnn_parameter_counts(input_shape, expected):
  model = registry.build_model('fedavg_cnn', input_shape, 10)
  assert model.count_params() == expected
  assert model.get_layer('encoder').output_shape == (None, 512)


def test_simple_cnn_shapes_and_count():
  encoder = cnn.build_simple_cnn((32, 32, 3))
  assert encoder.name == 'encoder'
  assert encoder.output_shape == (None, 120)
  # conv1 5*5*3*6+6 = 456, conv2 5*5*6*16+16 = 2,416,
  # fc1 (5*5*16)*120+120 = 48,120.
  assert encoder.count_params() == 456 + 2_416 + 48_120
  assert encoder(tf.zeros((3, 32, 32, 3))).shape == (3, 120)


def test_simple_cnn_options():
  encoder = cnn.build_simple_cnn((28, 28, 1), channels=(4, 8), hidden=30)
  assert encoder.output_shape == (None, 30)
  assert encoder.get_layer('conv2').filters == 8


def test_minimum_input_size_is_16():
  assert cnn.MIN_INPUT_SIZE == 16
  assert cnn.build_fedavg_cnn((16, 16, 1)).get_layer(
      'pool2'
  ).output_shape == (None, 1, 1, 64)
  with pytest.raises(ValueError, match=r'fedavg_cnn: .*at least 16'):
    cnn.build_fedavg_cnn((15, 28, 1))
  with pytest.raises(ValueError, match=r'simple_cnn: .*at least 16'):
    cnn.build_simple_cnn((28, 12, 3))


@pytest.mark.parametrize('name', ['simple_cnn', 'fedavg_cnn'])
def test_one_gradient_step_changes_every_variable(name, classification_step):
  model = registry.build_model(name, (28, 28, 1), 10)
  assert all(classification_step(model, (28, 28, 1), 10))


def test_bad_arguments():
  with pytest.raises(ValueError, match='fedavg_cnn: expects an input_shape'):
    cnn.build_fedavg_cnn((784,))
  with pytest.raises(ValueError, match='channels must have 2 entries'):
    cnn.build_simple_cnn((32, 32, 3), channels=(6, 16, 32))
  with pytest.raises(ValueError, match='hidden'):
    cnn.build_fedavg_cnn((32, 32, 3), hidden=0)
  with pytest.raises(TypeError, match='kernel_size'):
    cnn.build_fedavg_cnn((32, 32, 3), kernel_size=3)
