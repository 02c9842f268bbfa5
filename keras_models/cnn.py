"""Small two-convolution CNN encoders used in federated learning benchmarks.

Both encoders are `conv(5x5, valid, relu) -> max-pool(2) -> conv(5x5, valid,
relu) -> max-pool(2) -> flatten -> dense(relu)`; the classifier (a second
fully connected layer) is a separate head, e.g. `heads.build_linear_head`.

*   `simple_cnn`: the "SimpleCNN, two convolutional layers and two fully
    connected layers" of the FedPSD paper. The paper gives no layer widths;
    the defaults (6 and 16 channels, 120 hidden units) follow the LeNet-style
    SimpleCNN that is common in FL benchmarks.
*   `fedavg_cnn`: the 4-layer `FedAvgCNN` of the FedALA / PFLlib protocol (32
    and 64 channels, 512 hidden units). Encoder plus a 10-class linear head
    has 582,026 parameters on 28x28x1 inputs and 878,538 on 32x32x3 inputs,
    as in PFLlib.

Both need inputs of at least 16x16 (see `MIN_INPUT_SIZE`).
"""

from collections.abc import Sequence

import tensorflow as tf

from keras_models import _validation

_KERNEL_SIZE = 5
_POOL_SIZE = 2
_SPATIAL_OPS = (
    ('conv', _KERNEL_SIZE, 1, 0),
    ('pool', _POOL_SIZE, _POOL_SIZE, 0),
) * 2

# Smallest height/width leaving a >= 1x1 map after both conv + pool pairs.
MIN_INPUT_SIZE = _validation.min_spatial_size(_SPATIAL_OPS)


def _two_conv_encoder(
    model_name: str,
    input_shape: Sequence[int],
    channels: Sequence[int],
    hidden: int,
) -> tf.keras.Model:
  """Builds conv-pool-conv-pool-flatten-dense with validated arguments."""
  shape = _validation.check_input_shape(model_name, input_shape, rank=3)
  _validation.check_spatial_size(
      model_name,
      shape,
      MIN_INPUT_SIZE,
      'two 5x5 valid convolutions, each followed by a 2x2 max-pool',
  )
  channels = _validation.check_int_sequence(model_name, 'channels', channels)
  if len(channels) != 2:
    raise ValueError(
        f'{model_name}: channels must have 2 entries, got {channels!r}.'
    )
  hidden = _validation.check_positive_int(model_name, 'hidden', hidden)

  inputs = tf.keras.Input(shape=shape, name='image')
  x = inputs
  for i, filters in enumerate(channels, start=1):
    x = tf.keras.layers.Conv2D(
        filters,
        _KERNEL_SIZE,
        padding='valid',
        activation='relu',
        name=f'conv{i}',
    )(x)
    x = tf.keras.layers.MaxPool2D(_POOL_SIZE, name=f'pool{i}')(x)
  x = tf.keras.layers.Flatten(name='flatten')(x)
  outputs = tf.keras.layers.Dense(hidden, activation='relu', name='fc1')(x)
  return tf.keras.Model(inputs, outputs, name='encoder')


def build_simple_cnn(
    input_shape: Sequence[int],
    *,
    channels: Sequence[int] = (6, 16),
    hidden: int = 120,
) -> tf.keras.Model:
  """Builds the SimpleCNN encoder (FedPSD): two convs and the first FC layer.

  The FedPSD paper only says "two convolutional layers and two fully
  connected layers"; the default widths follow the LeNet-style SimpleCNN
  common in FL benchmarks. The second fully connected layer is the head.

  Args:
    input_shape: `(height, width, channels)` of one example, at least 16x16.
    channels: Filters of the two 5x5 convolutions.
    hidden: Units of the fully connected layer (the feature dimension).

  Returns:
    A functional `tf.keras.Model` named 'encoder' with output
    `[batch, hidden]`.

  Raises:
    ValueError: If `input_shape` is not `(height, width, channels)` with sides
      of at least 16, or an option has an invalid value.
  """
  return _two_conv_encoder('simple_cnn', input_shape, channels, hidden)


def build_fedavg_cnn(
    input_shape: Sequence[int],
    *,
    channels: Sequence[int] = (32, 64),
    hidden: int = 512,
) -> tf.keras.Model:
  """Builds the FedAvgCNN encoder of FedALA / PFLlib.

  Args:
    input_shape: `(height, width, channels)` of one example, at least 16x16.
    channels: Filters of the two 5x5 convolutions.
    hidden: Units of the fully connected layer (the feature dimension).

  Returns:
    A functional `tf.keras.Model` named 'encoder' with output
    `[batch, hidden]`.

  Raises:
    ValueError: If `input_shape` is not `(height, width, channels)` with sides
      of at least 16, or an option has an invalid value.
  """
  return _two_conv_encoder('fedavg_cnn', input_shape, channels, hidden)
