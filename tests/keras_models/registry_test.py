"""Tests for keras_models.registry and the package's public API."""

import pathlib

import numpy as np
import pytest
import tensorflow as tf

import keras_models
from keras_models import cnn
from keras_models import heads
from keras_models import registry

_ENCODER_NAMES = [
    'fedavg_cnn',
    'mlp',
    'mobilenet_v2',
    'resnet10',
    'resnet18',
    'resnet50',
    'simple_cnn',
    'vgg11',
]


def test_listing():
  assert registry.list_encoders() == _ENCODER_NAMES
  assert registry.list_heads() == ['linear', 'regression']
  assert registry.ENCODERS['fedavg_cnn'] is cnn.build_fedavg_cnn
  assert registry.HEADS['linear'] is heads.build_linear_head
  with pytest.raises(TypeError):
    registry.ENCODERS['new'] = cnn.build_simple_cnn  # Read-only mapping.


def test_describe():
  rows = registry.describe()
  assert [name for name, _, _ in rows] == _ENCODER_NAMES + [
      'linear',
      'regression',
  ]
  assert {kind for _, kind, _ in rows} == {'encoder', 'head'}
  assert all(isinstance(text, str) and text for _, _, text in rows)
  assert all(len(text) <= 72 for _, _, text in rows)


@pytest.mark.parametrize(
    'name, input_shape, feature_dim',
    [
        ('fedavg_cnn', (28, 28, 1), 512),
        ('mlp', (7,), 32),
        ('resnet10', (16, 16, 3), 512),
        ('simple_cnn', (32, 32, 3), 120),
        ('vgg11', (32, 32, 3), 512),
    ],
)
def test_build_encoder(name, input_shape, feature_dim):
  encoder = registry.build_encoder(name, input_shape)
  assert encoder.name == 'encoder'
  assert encoder.output_shape == (None, feature_dim)


def test_build_encoder_passes_options():
  encoder = registry.build_encoder('mlp', (7,), hidden=(3,))
  assert encoder.output_shape == (None, 3)


def test_unknown_names_list_known_names():
  with pytest.raises(KeyError) as error:
    registry.build_encoder('resnet34', (32, 32, 3))
  assert str(error.value) == (
      "Unknown encoder 'resnet34'; known encoders: "
      + ', '.join(_ENCODER_NAMES)
      + '.'
  )
  with pytest.raises(ValueError, match='known heads: linear, regression'):
    registry.build_head('softmax', 4, 2)
  with pytest.raises(ValueError, match='known heads'):
    registry.build_model('mlp', (4,), 2, head='mystery')
  with pytest.raises(keras_models.UnknownNameError, match='known encoders'):
    registry.build_model('mystery', (4,), 2)


def test_unknown_options_are_named():
  with pytest.raises(TypeError) as error:
    registry.build_encoder('vgg11', (32, 32, 3), dropout=0.1, depth=11)
  message = str(error.value)
  assert "encoder 'vgg11'" in message
  assert 'unknown option(s) depth, dropout' in message
  assert 'accepted options: batch_norm, hidden' in message
  with pytest.raises(TypeError, match='unknown option.*bias'):
    registry.build_head('linear', 4, 2, bias=False)
  with pytest.raises(TypeError, match='width'):
    registry.build_model('mlp', (4,), 2, encoder_options={'width': 2})
  # The same check without building anything, as programs run it on their
  # flags before hours of other cells.
  keras_models.check_encoder_options('vgg11', {'width': 0.25})
  with pytest.raises(TypeError, match="encoder 'vgg11' got unknown option"
                     r'\(s\) depth'):
    keras_models.check_encoder_options('vgg11', {'depth': 11})
  with pytest.raises(keras_models.UnknownNameError, match='known encoders'):
    keras_models.check_encoder_options('vgg16', {})


def test_build_model_structure_and_variable_order():
  model = registry.build_model('simple_cnn', (28, 28, 1), 10)
  encoder = model.get_layer('encoder')
  head = model.get_layer('head')
  assert [layer.name for layer in model.layers] == [
      'inputs',
      'encoder',
      'head',
  ]
  assert model.output_shape == (None, 10)
  # FedPer/FedRep split point: the encoder's trainable variables come first,
  # then the head's (kernel, bias of its single dense layer).
  refs = [v.ref() for v in model.trainable_variables]
  encoder_refs = [v.ref() for v in encoder.trainable_variables]
  head_refs = [v.ref() for v in head.trainable_variables]
  assert refs == encoder_refs + head_refs
  assert len(head_refs) == 2
  encoder_vars, head_vars = registry.split_trainable_variables(model)
  assert [v.ref() for v in encoder_vars] == encoder_refs
  assert [v.ref() for v in head_vars] == head_refs
  x = np.random.default_rng(0).normal(size=(2, 28, 28, 1)).astype(np.float32)
  np.testing.assert_allclose(
      model(x), head(encoder(x)), rtol=1e-6, atol=1e-6
  )


def test_split_point_holds_with_batch_norm():
  # Non-trainable batch norm statistics must not disturb the split.
  model = registry.build_model(
      'resnet10', (16, 16, 3), 3, encoder_options={'width': 0.25}
  )
  encoder_vars, head_vars = registry.split_trainable_variables(model)
  assert len(encoder_vars) + len(head_vars) == len(model.trainable_variables)
  assert [v.ref() for v in model.trainable_variables[-2:]] == [
      v.ref() for v in head_vars
  ]
  assert len(model.non_trainable_variables) > 0


def test_split_rejects_other_models():
  model = tf.keras.Sequential([tf.keras.layers.Dense(2, input_shape=(3,))])
  with pytest.raises(ValueError, match='build_model'):
    registry.split_trainable_variables(model)


def test_build_model_regression_head_and_options(sgd_step):
  model = registry.build_model(
      'mlp',
      (5,),
      1,
      head='regression',
      encoder_options={'hidden': (8,)},
      name='tabular',
  )
  assert model.name == 'tabular'
  assert model.get_layer('head').output_shape == (None, 1)
  assert model.get_layer('encoder').output_shape == (None, 8)
  x = np.ones((3, 5), np.float32)
  y = np.zeros((3, 1), np.float32)
  assert all(sgd_step(model, x, y, tf.keras.losses.MeanSquaredError()))


def test_public_api_is_exported():
  for name in keras_models.__all__:
    assert hasattr(keras_models, name), name
  assert keras_models.build_model is registry.build_model
  assert keras_models.GradientReversal.__module__ == 'keras_models.layers'


def test_no_tensorflow_federated_dependency():
  package_dir = pathlib.Path(keras_models.__file__).parent
  for path in package_dir.glob('*.py'):
    assert 'tensorflow_federated' not in path.read_text(), path
