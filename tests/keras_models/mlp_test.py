"""Tests for keras_models.mlp (tabular MLP encoder)."""

import numpy as np
import pytest
import tensorflow as tf

from keras_models import layers
from keras_models import mlp
from keras_models import registry


def test_default_shapes_and_count():
  model = mlp.build_mlp((10,))
  assert model.name == 'encoder'
  assert model.output_shape == (None, 32)
  assert model.count_params() == (10 * 64 + 64) + (64 * 32 + 32)
  assert model(tf.zeros((4, 10))).shape == (4, 32)


def test_dropout_is_active_only_in_training():
  model = mlp.build_mlp((8,), hidden=(16,), dropout=0.5)
  assert [l.name for l in model.layers] == ['features', 'dense1', 'dropout1']
  # Seeded: a run draws the same masks again (keras Dropout inside a TFF
  # computation would not).
  assert isinstance(model.layers[-1], layers.SeededDropout)
  x = np.ones((64, 8), np.float32)
  np.testing.assert_array_equal(model(x), model(x))
  assert not np.array_equal(model(x, training=True), model(x))


def test_empty_hidden_is_identity():
  model = mlp.build_mlp((5,), hidden=())
  x = np.arange(10, dtype=np.float32).reshape(2, 5)
  np.testing.assert_array_equal(model(x), x)
  assert model.count_params() == 0


def test_one_gradient_step_regression(sgd_step):
  model = registry.build_model(
      'mlp', (6,), 2, head='regression', encoder_options={'dropout': 0.1}
  )
  x = np.random.default_rng(0).normal(size=(4, 6)).astype(np.float32)
  y = np.ones((4, 2), np.float32)
  assert all(sgd_step(model, x, y, tf.keras.losses.MeanSquaredError()))


@pytest.mark.parametrize(
    'shape, options, match',
    [
        ((28, 28), {}, r'mlp: expects an input_shape of rank 1'),
        ((0,), {}, 'positive'),
        ((4,), {'hidden': (8, 0)}, 'hidden'),
        ((4,), {'hidden': 'wide'}, 'hidden'),
        ((4,), {'dropout': 1.0}, 'dropout'),
    ],
)
def test_bad_arguments(shape, options, match):
  with pytest.raises(ValueError, match=match):
    mlp.build_mlp(shape, **options)


def test_image_inputs_are_flattened():
  from keras_models import mlp  # pylint: disable=g-import-not-at-top
  model = mlp.build_mlp((8, 8, 1), hidden=(16,))
  assert model.output_shape == (None, 16)
  assert model.get_layer('flatten') is not None
  assert model.count_params() == 64 * 16 + 16
