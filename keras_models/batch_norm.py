"""Batch-normalization momentum shared by the encoders.

Every encoder here uses Keras momentum 0.9 for its moving statistics
(PyTorch's default `momentum=0.1`, the convention of the reference
implementations that personalized FL papers use), not the 0.999 of
`tf.keras.applications.MobileNetV2` or the 0.99 of Keras' default layer.
The moving statistics are what evaluation uses, and in federated training a
client takes few steps: an AFedCL cell of the AFedCL paper (5 samples per
client, batch 8, 3 local epochs, 40 rounds) takes 120 local steps in all,
after which momentum 0.999 has moved the statistics 1 - 0.999**120 = 11 %
of the way from their initial values (mean 0, variance 1); the model fits
its batches in training mode and predicts one class in inference mode.
With 0.9 less than 2 % of the initial values remain after 40 steps
(0.9**40). Batch norm stays fragile at very few steps whatever the momentum
(the statistics lag weights that are still moving fast); see BUILD_NOTES.
"""

import tensorflow as tf

from keras_models import _validation

DEFAULT_MOMENTUM = 0.9


def set_momentum(model_name: str, model: tf.keras.Model,
                 momentum: float) -> tf.keras.Model:
  """Sets the momentum of every `BatchNormalization` layer of `model`.

  The layers read `momentum` when they are called, so this must run before
  the model is traced (e.g. right after it is built).

  Args:
    model_name: Name of the model being built, used in error messages.
    model: A Keras model.
    momentum: The moving-statistics momentum, in [0, 1).

  Returns:
    `model`, changed in place.

  Raises:
    ValueError: If `momentum` is not a number in [0, 1).
  """
  momentum = _validation.check_rate(model_name, 'bn_momentum', momentum)
  for layer in model.submodules:
    if isinstance(layer, tf.keras.layers.BatchNormalization):
      layer.momentum = momentum
  return model
