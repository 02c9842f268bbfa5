"""Heads mapping an encoder's `[batch, feature_dim]` features to outputs.

*   `build_linear_head`: classification logits (no softmax), the personalized
    part of FedPer/FedRep-style models.
*   `build_regression_head`: a linear regression output.
*   `build_discriminator`: the per-client domain discriminator of AFedCL, a
    ReLU hidden dense layer and a dense layer with a single logit; it is
    usually fed through `layers.GradientReversal` for adversarial training.
"""

from collections.abc import Sequence
from typing import Union

import tensorflow as tf

from keras_models import _validation


def _features_input(feature_dim: int) -> tf.Tensor:
  return tf.keras.Input(shape=(feature_dim,), name='features')


def build_linear_head(feature_dim: int, num_outputs: int) -> tf.keras.Model:
  """Builds a dense layer producing classification logits (no softmax).

  Args:
    feature_dim: Size of the input feature vector.
    num_outputs: Number of classes (logits).

  Returns:
    A functional `tf.keras.Model` named 'head' mapping
    `[batch, feature_dim]` to `[batch, num_outputs]`.

  Raises:
    ValueError: If `feature_dim` or `num_outputs` is not a positive int.
  """
  feature_dim = _validation.check_positive_int(
      'linear head', 'feature_dim', feature_dim
  )
  num_outputs = _validation.check_positive_int(
      'linear head', 'num_outputs', num_outputs
  )
  inputs = _features_input(feature_dim)
  outputs = tf.keras.layers.Dense(num_outputs, name='logits')(inputs)
  return tf.keras.Model(inputs, outputs, name='head')


def build_regression_head(
    feature_dim: int, num_outputs: int = 1
) -> tf.keras.Model:
  """Builds a dense layer with linear outputs for regression.

  Args:
    feature_dim: Size of the input feature vector.
    num_outputs: Number of regression targets.

  Returns:
    A functional `tf.keras.Model` named 'head' mapping
    `[batch, feature_dim]` to `[batch, num_outputs]`.

  Raises:
    ValueError: If `feature_dim` or `num_outputs` is not a positive int.
  """
  feature_dim = _validation.check_positive_int(
      'regression head', 'feature_dim', feature_dim
  )
  num_outputs = _validation.check_positive_int(
      'regression head', 'num_outputs', num_outputs
  )
  inputs = _features_input(feature_dim)
  outputs = tf.keras.layers.Dense(
      num_outputs, activation='linear', name='prediction'
  )(inputs)
  return tf.keras.Model(inputs, outputs, name='head')


def build_discriminator(
    feature_dim: int, hidden: Union[int, Sequence[int]] = 256
) -> tf.keras.Model:
  """Builds a per-client discriminator: ReLU dense layer(s) -> one logit.

  With the default (an int) it has two dense layers, as AFedCL's
  discriminator; the hidden width is not given by the paper and 256 is this
  library's choice. A sequence of ints gives one ReLU layer per entry.

  Args:
    feature_dim: Size of the input feature vector.
    hidden: Units of the hidden ReLU dense layer (or layers).

  Returns:
    A functional `tf.keras.Model` named 'discriminator' mapping
    `[batch, feature_dim]` to `[batch, 1]` logits (no sigmoid).

  Raises:
    ValueError: If `feature_dim` or `hidden` is invalid.
  """
  feature_dim = _validation.check_positive_int(
      'discriminator', 'feature_dim', feature_dim
  )
  hidden = _validation.check_int_sequence('discriminator', 'hidden', hidden)
  inputs = _features_input(feature_dim)
  x = inputs
  for i, units in enumerate(hidden, start=1):
    x = tf.keras.layers.Dense(units, activation='relu', name=f'dense{i}')(x)
  outputs = tf.keras.layers.Dense(1, name='logit')(x)
  return tf.keras.Model(inputs, outputs, name='discriminator')
