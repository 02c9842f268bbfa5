"""Custom Keras layers."""

import math
import numbers
from typing import Any

import tensorflow as tf


def _check_lambda(lambda_: Any) -> float:
  if (
      isinstance(lambda_, bool)
      or not isinstance(lambda_, numbers.Real)
      or not math.isfinite(lambda_)
  ):
    raise ValueError(
        f'GradientReversal: lambda_ must be a finite number, got {lambda_!r}.'
    )
  return float(lambda_)


def reverse_gradient(x: tf.Tensor, lambda_: float = 1.0) -> tf.Tensor:
  """Identity in the forward pass; scales gradients by `-lambda_` backward.

  Args:
    x: A floating point tensor.
    lambda_: Scale of the reversed gradient (0 blocks the gradient).

  Returns:
    A tensor equal to `x` whose gradient is `-lambda_` times the incoming
    gradient.

  Raises:
    ValueError: If `lambda_` is not a finite number.
  """
  scale = -_check_lambda(lambda_)

  @tf.custom_gradient
  def _reverse(value):
    def grad(upstream):
      return tf.cast(scale, upstream.dtype) * upstream

    return tf.identity(value), grad

  return _reverse(x)


@tf.keras.utils.register_keras_serializable(package='keras_models')
class GradientReversal(tf.keras.layers.Layer):
  """Gradient reversal layer (Ganin & Lempitsky, 2015).

  The forward pass is the identity; the backward pass multiplies the incoming
  gradient by `-lambda_`. Placed between an encoder and a discriminator, it
  lets one minimization train the discriminator to separate domains while
  pushing the encoder to confuse it. The layer has no weights.
  """

  def __init__(self, lambda_: float = 1.0, **kwargs: Any):
    """Initializes the layer.

    Args:
      lambda_: Scale of the reversed gradient (0 blocks the gradient).
      **kwargs: Standard `tf.keras.layers.Layer` arguments (e.g. `name`).

    Raises:
      ValueError: If `lambda_` is not a finite number.
    """
    super().__init__(**kwargs)
    self.lambda_ = _check_lambda(lambda_)

  def call(self, inputs: tf.Tensor) -> tf.Tensor:
    return reverse_gradient(inputs, self.lambda_)

  def compute_output_shape(self, input_shape: Any) -> Any:
    return input_shape

  def get_config(self) -> dict[str, Any]:
    config = super().get_config()
    config['lambda_'] = self.lambda_
    return config


@tf.keras.utils.register_keras_serializable(package='keras_models')
class SeededDropout(tf.keras.layers.Layer):
  """Inverted dropout whose mask is a function of `seed` and the input.

  Keras' `Dropout` draws its mask from a stateful random op. Inside a TFF
  computation, which is traced into a fresh graph without a graph-level
  seed, that op gets a new random seed whenever the computation is
  instantiated, so `tf.keras.utils.set_random_seed` does not reach it: two
  runs with one seed drop different units, and a run resumed from a
  checkpoint differs from an unstopped one. Here the mask is
  `tf.random.stateless_uniform` seeded with `seed` and a fingerprint of the
  input tensor. The input changes with every batch and with every step's
  weights, so masks differ from step to step as `Dropout`'s do, while the
  same run draws the same masks again. In training, kept units are scaled
  by 1 / (1 - rate); at inference the layer is the identity.
  """

  def __init__(self, rate: float, seed: int = 0, **kwargs: Any):
    """Initializes the layer.

    Args:
      rate: Fraction of the units to drop, in [0, 1).
      seed: Python int mixed into every mask's seed (e.g. the layer's
        index, so that two layers given one input draw different masks).
      **kwargs: Standard `tf.keras.layers.Layer` arguments (e.g. `name`).

    Raises:
      ValueError: If `rate` is not in [0, 1) or `seed` is not an int.
    """
    super().__init__(**kwargs)
    if (isinstance(rate, bool) or not isinstance(rate, numbers.Real)
        or not 0.0 <= rate < 1.0):
      raise ValueError(
          f'SeededDropout: rate must be a number in [0, 1), got {rate!r}.')
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
      raise ValueError(f'SeededDropout: seed must be an int, got {seed!r}.')
    self.rate = float(rate)
    self.seed = int(seed)

  def _drop(self, inputs: tf.Tensor) -> tf.Tensor:
    # 8 fingerprint bytes of the whole tensor -> two int32 seed words.
    digest = tf.fingerprint(tf.reshape(inputs, [1, -1]))
    words = tf.bitcast(tf.reshape(digest, [2, 4]), tf.int32)
    seed = tf.bitwise.bitwise_xor(
        words, tf.constant([self.seed % 2**31, 0], tf.int32))
    keep = tf.random.stateless_uniform(tf.shape(inputs), seed) >= self.rate
    return tf.where(keep, inputs / (1.0 - self.rate), tf.zeros_like(inputs))

  def call(self, inputs: tf.Tensor, training: Any = None) -> tf.Tensor:
    if training is None:
      training = tf.keras.backend.learning_phase()
    if self.rate == 0.0:
      return tf.identity(inputs)
    if isinstance(training, (bool, int)):
      return self._drop(inputs) if training else tf.identity(inputs)
    return tf.cond(tf.cast(training, tf.bool), lambda: self._drop(inputs),
                   lambda: tf.identity(inputs))

  def compute_output_shape(self, input_shape: Any) -> Any:
    return input_shape

  def get_config(self) -> dict[str, Any]:
    config = super().get_config()
    config.update(rate=self.rate, seed=self.seed)
    return config
