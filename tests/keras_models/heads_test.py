"""Tests for keras_models.heads."""

import numpy as np
import pytest
import tensorflow as tf

from keras_models import heads


def test_linear_head():
  head = heads.build_linear_head(16, 10)
  assert head.name == 'head'
  assert head.output_shape == (None, 10)
  assert head.count_params() == 16 * 10 + 10
  # Logits: no softmax, so outputs are not a probability distribution.
  out = head(np.random.default_rng(0).normal(size=(3, 16)) * 10)
  assert out.shape == (3, 10)
  assert not np.allclose(tf.reduce_sum(out, axis=-1), 1.0)


def test_regression_head():
  head = heads.build_regression_head(8)
  assert head.name == 'head'
  assert head.output_shape == (None, 1)
  assert head.get_layer('prediction').activation is tf.keras.activations.linear
  assert heads.build_regression_head(8, 3).output_shape == (None, 3)


def test_discriminator():
  disc = heads.build_discriminator(32, hidden=64)
  assert disc.name == 'discriminator'
  dense = [l for l in disc.layers if isinstance(l, tf.keras.layers.Dense)]
  assert [l.units for l in dense] == [64, 1]
  assert disc.count_params() == (32 * 64 + 64) + (64 + 1)
  assert disc(tf.zeros((5, 32))).shape == (5, 1)
  assert heads.build_discriminator(4).output_shape == (None, 1)
  deeper = heads.build_discriminator(4, hidden=(8, 8))
  assert deeper.count_params() == (4 * 8 + 8) + (8 * 8 + 8) + (8 + 1)


@pytest.mark.parametrize(
    'builder, args',
    [
        (heads.build_linear_head, (0, 10)),
        (heads.build_linear_head, (16, 0)),
        (heads.build_regression_head, (16.5, 1)),
        (heads.build_discriminator, (-1,)),
        (heads.build_discriminator, (8, ())),
    ],
)
def test_bad_arguments(builder, args):
  with pytest.raises(ValueError, match='must'):
    builder(*args)
