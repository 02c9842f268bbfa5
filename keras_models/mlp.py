"""Multi-layer perceptron encoder for tabular data (and flattened images)."""

from collections.abc import Sequence

import tensorflow as tf

from keras_models import _validation
from keras_models import layers


def build_mlp(
    input_shape: Sequence[int],
    *,
    hidden: Sequence[int] = (64, 32),
    dropout: float = 0.0,
) -> tf.keras.Model:
  """Builds an MLP encoder: ReLU dense layers, each optionally with dropout.

  Args:
    input_shape: `(num_features,)`, or `(height, width, channels)` for
      images, which are flattened first (e.g. the 8x8 digits demo).
    hidden: Units of the ReLU dense layers. An empty sequence gives the
      identity encoder (features are the inputs), so that with a linear head
      the model is a linear (logistic) regression.
    dropout: Dropout rate in [0, 1) applied after every dense layer; 0
      (default) adds no dropout layers. The layers are
      `layers.SeededDropout`, whose masks a run reproduces exactly (Keras'
      `Dropout` is not seeded inside TFF computations).

  Returns:
    A functional `tf.keras.Model` named 'encoder' with output
    `[batch, hidden[-1]]` (`[batch, num_features]` when `hidden` is empty).

  Raises:
    ValueError: If `input_shape` is neither `(num_features,)` nor `(h, w, c)`,
      or an option has an invalid value.
  """
  name = 'mlp'
  rank = 3 if (not isinstance(input_shape, (str, bytes))
               and hasattr(input_shape, '__len__')
               and len(input_shape) == 3) else 1
  shape = _validation.check_input_shape(name, input_shape, rank=rank)
  hidden = _validation.check_int_sequence(
      name, 'hidden', hidden, allow_empty=True
  )
  dropout = _validation.check_rate(name, 'dropout', dropout)

  inputs = tf.keras.Input(shape=shape, name='features')
  x = tf.keras.layers.Flatten(name='flatten')(inputs) if rank == 3 else inputs
  for i, units in enumerate(hidden, start=1):
    x = tf.keras.layers.Dense(units, activation='relu', name=f'dense{i}')(x)
    if dropout:
      x = layers.SeededDropout(dropout, seed=i, name=f'dropout{i}')(x)
  if not hidden:
    x = tf.keras.layers.Activation('linear', name='identity')(x)
  return tf.keras.Model(inputs, x, name='encoder')
