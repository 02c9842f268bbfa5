"""What an algorithm needs to know about a Keras model.

Algorithms build the same Keras model many times (TFF traces client work,
evaluation and initialization separately), so they take a `ModelSpec`: a
no-argument builder returning a *fresh* uncompiled Keras model on every call,
plus the batched input spec, the task and the number of outputs. Initial
weights are drawn once, seeded, in eager mode (`initial_weights`), because
random ops inside TFF computations cannot be seeded reproducibly (op-level
seeds replay every invocation, graph-level seeds are not allowed).
"""

import collections
from collections.abc import Callable
import dataclasses
import hashlib
import json
import re
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

ModelWeights = tff.learning.models.ModelWeights
TASKS = ('classification', 'regression')


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """A Keras model builder and the data it consumes.

  Attributes:
    keras_model_fn: no-argument callable returning a new Keras model mapping
      a batch of `x` to logits (classification) or predictions (regression).
    input_spec: element spec of a *batched* client dataset,
      `OrderedDict(x=TensorSpec([None, ...]), y=TensorSpec([None]))`,
      optionally with `index=TensorSpec([None], tf.int64)`, each sample's
      position in its client's split (`client_data.with_index`), which
      methods with per-sample client state need.
    task: 'classification' or 'regression'.
    num_outputs: number of classes, or of regression targets.
  """
  keras_model_fn: Callable[[], tf.keras.Model]
  input_spec: Any
  task: str
  num_outputs: int

  def __post_init__(self):
    if self.task not in TASKS:
      raise ValueError(f'unknown task {self.task!r}; expected one of {TASKS}.')
    if self.num_outputs < 1:
      raise ValueError(f'num_outputs must be >= 1, got {self.num_outputs}.')
    if not isinstance(self.input_spec, collections.abc.Mapping) or set(
        self.input_spec) not in ({'x', 'y'}, {'x', 'y', 'index'}):
      raise ValueError('input_spec must be a mapping with keys x and y (and '
                       f'optionally index), got {self.input_spec!r}.')

  @property
  def has_index(self) -> bool:
    """Whether client datasets carry each sample's `index`."""
    return 'index' in self.input_spec

  def loss(self, y_true: tf.Tensor, outputs: tf.Tensor) -> tf.Tensor:
    """Mean training loss of a batch: cross-entropy on logits, or MSE."""
    if self.task == 'classification':
      return tf.reduce_mean(
          tf.keras.losses.sparse_categorical_crossentropy(
              y_true, outputs, from_logits=True))
    y = tf.reshape(tf.cast(y_true, outputs.dtype), tf.shape(outputs))
    return tf.reduce_mean(tf.square(outputs - y))

  def weights_type(self) -> tff.Type:
    """The TFF type of this model's `ModelWeights`."""
    with tf.Graph().as_default():
      model = self.keras_model_fn()
      return tff.types.tensorflow_to_type(
          tf.nest.map_structure(
              lambda v: tf.TensorSpec(v.shape, v.dtype),
              ModelWeights.from_model(model)))

  def num_head_variables(self) -> int:
    """How many trailing trainable tensors form the head (classifier).

    Models from `keras_models.build_model` have a nested model named 'head'
    whose variables come last; for other models the last layer with
    trainable weights is taken as the head.
    """
    with tf.Graph().as_default():
      model = self.keras_model_fn()
      try:
        head = model.get_layer('head')
      except ValueError:
        head = [l for l in model.layers if l.trainable_weights][-1]
      n = len(head.trainable_weights)
      total = len(model.trainable_weights)
      if not 0 < n < total or any(
          a is not b for a, b in zip(head.trainable_weights,
                                     model.trainable_weights[-n:])):
        raise ValueError('the head\'s trainable variables must be the '
                         'model\'s last ones, after a non-empty body.')
      return n

  def encoder_sizes(self, method: str) -> tuple[int, int, int]:
    """Feature dim and encoder trainable / non-trainable tensor counts.

    For methods that need the 'encoder' and 'head' sub-models of
    `keras_models.build_model` (AFedCL, MOON); a ValueError naming `method`
    otherwise.
    """
    with tf.Graph().as_default():
      model = self.keras_model_fn()
      try:
        encoder = model.get_layer('encoder')
        model.get_layer('head')
      except ValueError as e:
        raise ValueError(f'{method} needs a model from keras_models.'
                         "build_model with 'encoder' and 'head' "
                         'sub-models.') from e
      return (int(encoder.output_shape[-1]), len(encoder.trainable_weights),
              len(encoder.non_trainable_weights))

  def architecture(self) -> str:
    """A short hash of what the built model computes, weights aside.

    It covers every layer's class and settings (recursively through nested
    models, layer names excluded: Keras numbers them per session) and every
    weight's shape and dtype, so it changes with settings that change no
    shape, such as a batch-norm momentum or a dropout rate. Checkpoints
    record it (`loop.run`): a run cannot resume under a model that the code
    now builds differently.
    """
    with tf.Graph().as_default():
      model = self.keras_model_fn()
      text = json.dumps(
          [_layer_settings(model),
           [(v.shape.as_list(), v.dtype.name) for v in model.weights]],
          sort_keys=True, default=str)
    text = re.sub(r' at 0x[0-9a-fA-F]+', '', text)   # object addresses
    return hashlib.sha256(text.encode()).hexdigest()[:16]

  def data_type(self) -> tff.SequenceType:
    """The TFF type of one client's batched dataset."""
    return tff.SequenceType(tff.types.tensorflow_to_type(self.input_spec))

  def initial_weights(self, seed: int) -> ModelWeights:
    """Seeded initial weights as NumPy arrays (eager, outside TFF)."""
    tf.keras.utils.set_random_seed(int(seed))
    model = self.keras_model_fn()
    return ModelWeights(
        trainable=[np.array(v.numpy()) for v in model.trainable_weights],
        non_trainable=[np.array(v.numpy()) for v in
                       model.non_trainable_weights])


def _layer_settings(model: tf.keras.Model) -> list[Any]:
  """[class name, settings] of each of `model`'s layers, nested models as
  the list of theirs."""
  rows = []
  for layer in model.layers:
    if isinstance(layer, tf.keras.Model):
      rows.append([type(layer).__name__, _layer_settings(layer)])
      continue
    try:
      config = dict(layer.get_config())
    except NotImplementedError:   # a custom layer without get_config
      config = {}
    config.pop('name', None)
    if isinstance(layer, tf.keras.layers.Lambda):
      # Its config holds the marshalled code, which embeds the file's path:
      # a copy of the code elsewhere would read as another model.
      config['function'] = getattr(layer.function, '__qualname__', '')
    rows.append([type(layer).__name__, config])
  return rows


def assign_weights(model: tf.keras.Model, weights: ModelWeights) -> None:
  """Assigns `weights` to the model's trainable and non-trainable variables."""
  tf.nest.map_structure(lambda v, t: v.assign(t),
                        ModelWeights.from_model(model), weights)


def read_weights(model: tf.keras.Model) -> ModelWeights:
  """The model's current weights as tensors."""
  return tf.nest.map_structure(tf.identity, ModelWeights.from_model(model))
