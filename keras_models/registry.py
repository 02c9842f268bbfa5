"""Registry of encoders and heads, and assembly of encoder + head models.

Every model of this library is `inputs -> encoder -> head -> outputs`, built by
`build_model`, where the encoder and the head are nested functional models
named 'encoder' and 'head'. Keras orders `model.trainable_variables` by layer,
so they are all the encoder's trainable variables followed by all the head's:
FedPer/FedRep-style algorithms split the model at that boundary, e.g. with
`split_trainable_variables`.
"""

from collections.abc import Callable, Mapping, Sequence
import dataclasses
import inspect
import types
from typing import Any, Optional

import tensorflow as tf

from keras_models import cnn
from keras_models import heads
from keras_models import mlp
from keras_models import mobilenet_v2
from keras_models import resnet
from keras_models import resnet50
from keras_models import vgg

EncoderBuilder = Callable[..., tf.keras.Model]
HeadBuilder = Callable[..., tf.keras.Model]


class UnknownNameError(KeyError, ValueError):
  """An encoder or head name is not registered.

  Both a `KeyError` (a failed registry look-up) and a `ValueError` (a bad
  argument value), so callers may catch either.
  """

  def __str__(self) -> str:
    # KeyError would otherwise show the repr of the message, with quotes.
    return str(self.args[0]) if self.args else ''


@dataclasses.dataclass(frozen=True)
class _Entry:
  builder: Callable[..., tf.keras.Model]
  description: str


_ENCODER_ENTRIES: Mapping[str, _Entry] = {
    'fedavg_cnn': _Entry(
        cnn.build_fedavg_cnn,
        'FedAvgCNN of FedALA/PFLlib: 2 conv (32, 64) + FC 512.',
    ),
    'mlp': _Entry(
        mlp.build_mlp, 'MLP for tabular data: ReLU dense layers (64, 32).'
    ),
    'mobilenet_v2': _Entry(
        mobilenet_v2.build_mobilenet_v2,
        'Keras MobileNetV2 without top + global average pooling (1280).',
    ),
    'resnet10': _Entry(
        resnet.build_resnet10,
        'BasicBlock ResNet-10 [1,1,1,1], CIFAR stem for small inputs (512).',
    ),
    'resnet18': _Entry(
        resnet.build_resnet18,
        'BasicBlock ResNet-18 [2,2,2,2], CIFAR stem for small inputs (512).',
    ),
    'resnet50': _Entry(
        resnet50.build_resnet50,
        'Keras ResNet50 without top + global average pooling (2048).',
    ),
    'simple_cnn': _Entry(
        cnn.build_simple_cnn,
        'FedPSD SimpleCNN (LeNet-style): 2 conv (6, 16) + FC 120.',
    ),
    'vgg11': _Entry(
        vgg.build_vgg11, 'VGG-11 convolutions, optional batch norm (512).'
    ),
}

_HEAD_ENTRIES: Mapping[str, _Entry] = {
    'linear': _Entry(
        heads.build_linear_head, 'Dense layer producing logits (no softmax).'
    ),
    'regression': _Entry(
        heads.build_regression_head, 'Dense layer with linear outputs.'
    ),
}

ENCODERS: Mapping[str, EncoderBuilder] = types.MappingProxyType(
    {name: entry.builder for name, entry in _ENCODER_ENTRIES.items()}
)
HEADS: Mapping[str, HeadBuilder] = types.MappingProxyType(
    {name: entry.builder for name, entry in _HEAD_ENTRIES.items()}
)


def list_encoders() -> list[str]:
  """Returns the registered encoder names, sorted."""
  return sorted(ENCODERS)


def list_heads() -> list[str]:
  """Returns the registered head names, sorted."""
  return sorted(HEADS)


def describe() -> list[tuple[str, str, str]]:
  """Returns `(name, kind, description)` for every encoder, then every head.

  `kind` is 'encoder' or 'head'; the descriptions are one line each, for a
  `--list` command line flag.
  """
  rows = [
      (name, 'encoder', _ENCODER_ENTRIES[name].description)
      for name in list_encoders()
  ]
  rows.extend(
      (name, 'head', _HEAD_ENTRIES[name].description) for name in list_heads()
  )
  return rows


def _lookup(kind: str, name: Any, registry: Mapping[str, Any]) -> Any:
  if not isinstance(name, str) or name not in registry:
    raise UnknownNameError(
        f'Unknown {kind} {name!r}; known {kind}s: '
        f'{", ".join(sorted(registry))}.'
    )
  return registry[name]


def _check_options(
    kind: str,
    name: str,
    builder: Callable[..., Any],
    options: Mapping[str, Any],
    positional: Sequence[str],
) -> None:
  """Raises TypeError naming every option `builder` does not accept."""
  accepted = [
      param
      for param in inspect.signature(builder).parameters
      if param not in positional
  ]
  unknown = sorted(set(options) - set(accepted))
  if unknown:
    raise TypeError(
        f'{kind} {name!r} got unknown option(s) {", ".join(unknown)}; '
        f'accepted options: {", ".join(accepted) or "none"}.'
    )


def build_encoder(
    name: str, input_shape: Sequence[int], **options: Any
) -> tf.keras.Model:
  """Builds the registered encoder `name`.

  Args:
    name: One of `list_encoders()`.
    input_shape: Shape of one example, without the batch dimension.
    **options: Options of that encoder's builder, e.g. `alpha` for
      'mobilenet_v2'.

  Returns:
    A functional `tf.keras.Model` named 'encoder' with a
    `[batch, feature_dim]` output.

  Raises:
    UnknownNameError: (a `KeyError` and `ValueError`) If `name` is not
      registered; the message lists the known encoders.
    TypeError: If an option is not accepted by the encoder; the message names
      the unknown and the accepted options.
    ValueError: If `input_shape` or an option value is invalid.
  """
  check_encoder_options(name, options)
  return ENCODERS[name](input_shape, **options)


def check_encoder_options(name: str, options: Mapping[str, Any]) -> None:
  """Raises as `build_encoder` would for an unknown name or option name,
  building nothing (option values are checked when the encoder is built).

  Raises:
    UnknownNameError: If `name` is not registered.
    TypeError: If an option is not accepted by the encoder.
  """
  builder = _lookup('encoder', name, ENCODERS)
  _check_options('encoder', name, builder, options, ('input_shape',))


def build_head(
    name: str, feature_dim: int, num_outputs: int, **options: Any
) -> tf.keras.Model:
  """Builds the registered head `name`.

  Args:
    name: One of `list_heads()`.
    feature_dim: Size of the encoder's feature vector.
    num_outputs: Number of outputs (classes or regression targets).
    **options: Options of that head's builder (the built-in heads have none).

  Returns:
    A functional `tf.keras.Model` named 'head'.

  Raises:
    UnknownNameError: (a `KeyError` and `ValueError`) If `name` is not
      registered; the message lists the known heads.
    TypeError: If an option is not accepted by the head.
    ValueError: If `feature_dim` or `num_outputs` is invalid.
  """
  builder = _lookup('head', name, HEADS)
  _check_options(
      'head', name, builder, options, ('feature_dim', 'num_outputs')
  )
  return builder(feature_dim, num_outputs, **options)


def build_model(
    encoder: str,
    input_shape: Sequence[int],
    num_outputs: int,
    *,
    head: str = 'linear',
    encoder_options: Optional[Mapping[str, Any]] = None,
    head_options: Optional[Mapping[str, Any]] = None,
    name: str = 'model',
) -> tf.keras.Model:
  """Builds the functional model `inputs -> encoder -> head -> outputs`.

  `model.get_layer('encoder')` and `model.get_layer('head')` are the two
  nested models, and `model.trainable_variables` lists all the encoder's
  trainable variables followed by all the head's (see
  `split_trainable_variables`).

  Args:
    encoder: Name of a registered encoder, one of `list_encoders()`.
    input_shape: Shape of one example, without the batch dimension.
    num_outputs: Number of outputs of the head (classes for 'linear').
    head: Name of a registered head, one of `list_heads()`.
    encoder_options: Options for the encoder builder.
    head_options: Options for the head builder.
    name: Name of the returned model.

  Returns:
    A functional `tf.keras.Model`.

  Raises:
    UnknownNameError: (a `KeyError` and `ValueError`) If `encoder` or `head`
      is not registered.
    TypeError: If an option is not accepted by the encoder or head.
    ValueError: If `input_shape`, `num_outputs` or an option is invalid.
  """
  # Look both names up before building anything, so a typo in `head` fails
  # fast instead of after building a large encoder.
  _lookup('encoder', encoder, ENCODERS)
  _lookup('head', head, HEADS)
  encoder_model = build_encoder(
      encoder, input_shape, **dict(encoder_options or {})
  )
  feature_dim = encoder_model.output_shape[-1]
  head_model = build_head(
      head, feature_dim, num_outputs, **dict(head_options or {})
  )
  inputs = tf.keras.Input(shape=encoder_model.input_shape[1:], name='inputs')
  outputs = head_model(encoder_model(inputs))
  return tf.keras.Model(inputs, outputs, name=name)


def split_trainable_variables(
    model: tf.keras.Model,
) -> tuple[list[tf.Variable], list[tf.Variable]]:
  """Splits a `build_model` model's trainable variables at the encoder/head.

  Args:
    model: A model built by `build_model`.

  Returns:
    `(encoder_variables, head_variables)`, whose concatenation is
    `model.trainable_variables` in order.

  Raises:
    ValueError: If `model` has no 'encoder' and 'head' layers, or its
      trainable variables are not the encoder's followed by the head's.
  """
  try:
    encoder_vars = list(model.get_layer('encoder').trainable_variables)
    head_vars = list(model.get_layer('head').trainable_variables)
  except ValueError as e:
    raise ValueError(
        f'Model {model.name!r} has no nested "encoder" and "head" models; '
        'build it with build_model.'
    ) from e
  expected = [v.ref() for v in encoder_vars + head_vars]
  if [v.ref() for v in model.trainable_variables] != expected:
    raise ValueError(
        f'Trainable variables of model {model.name!r} are not the '
        "encoder's followed by the head's."
    )
  return encoder_vars, head_vars
