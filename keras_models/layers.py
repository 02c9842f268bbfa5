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
