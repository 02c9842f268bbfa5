"""Client-work building blocks shared by algorithms.

`build_local_update` returns the TensorFlow function at the heart of most
client works: start a Keras model from given weights, train it locally
(`local_training.train_model`, the one training loop), and report the final
weights, training sums and whether everything stayed finite. Algorithms wrap
it in their `tff.tensorflow.computation` and decide what the client uploads
(`model_delta`) and what it keeps (its client state).

Ordering rule: inside a `tff.tensorflow.computation` body (graph mode),
separate `tf.function` calls that touch the same Keras variables are NOT
ordered by automatic control dependencies. A client work that runs several
local steps on one model must call them from a single `tf.function` (as
Ditto and FedRep do), or give each step its own model.

Per-round learning-rate decay: the client learning rate of round `r`
(0-based) is `lr * decay**r`, where `lr` is the optimizer's own learning rate
and `r` arrives in the broadcast (`Broadcast.round_num`).
"""

import collections
from collections.abc import Callable
from typing import Any, NamedTuple, Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_pfl.core import model_spec as model_spec_lib
from tff_pfl.templates import local_training

ModelWeights = tff.learning.models.ModelWeights


class LocalResult(NamedTuple):
  weights: Any        # ModelWeights after training
  metrics: Any        # OrderedDict(loss_sum, num_examples, non_finite)
  finite: Any         # bool scalar: weights and loss are finite
  num_steps: Any      # float32 optimizer steps taken (batches x epochs)


def build_local_update(
    spec: model_spec_lib.ModelSpec,
    optimizer: tff.learning.optimizers.Optimizer,
    *,
    epochs: int,
    learning_rate_decay: float = 1.0,
    extra_loss_fn: Optional[Callable[..., Any]] = None,
    trainable_slice: Optional[slice] = None,
) -> Callable[..., LocalResult]:
  """Builds `local_update(model, start_weights, dataset, round_num, anchor)`.

  Args:
    spec: model spec.
    optimizer: TFF client optimizer (fresh state every call).
    epochs: local epochs, >= 1.
    learning_rate_decay: per-round multiplicative decay of the client
      learning rate, in (0, 1].
    extra_loss_fn: optional `(anchor_weights) -> ExtraLossFn` factory: given
      the anchor weights (the call's `anchor`, default its start weights),
      returns the extra loss term for `local_training.train_model` (e.g. a
      proximal pull towards the global model).
    trainable_slice: train only `model.trainable_variables[trainable_slice]`
      (e.g. FedRep's head or body); default all.

  Returns:
    A `tf.function` returning a `LocalResult`.
  """
  if epochs < 1:
    raise ValueError(f'local epochs must be >= 1, got {epochs}.')
  if not 0.0 < learning_rate_decay <= 1.0:
    raise ValueError('learning_rate_decay must be in (0, 1], got '
                     f'{learning_rate_decay}.')

  @tf.function
  def local_update(model, start_weights, dataset, round_num, anchor=None):
    model_spec_lib.assign_weights(model, start_weights)
    learning_rate = decayed_learning_rate(
        optimizer, learning_rate_decay, round_num, model.trainable_variables)
    anchor = start_weights if anchor is None else anchor
    extra = extra_loss_fn(anchor) if extra_loss_fn else None
    variables = None
    if trainable_slice is not None:
      variables = model.trainable_variables[trainable_slice]
    sums = local_training.train_model(
        spec, model, optimizer, dataset, epochs, variables=variables,
        extra_loss_fn=extra, learning_rate=learning_rate)
    weights = model_spec_lib.read_weights(model)
    finite = tf.logical_and(local_training.all_finite(weights),
                            tf.math.is_finite(sums['loss_sum']))
    metrics = collections.OrderedDict(
        loss_sum=tf.where(finite, sums['loss_sum'], 0.0),
        num_examples=sums['num_examples'],
        non_finite=1.0 - tf.cast(finite, tf.float32))
    return LocalResult(weights, metrics, finite, sums['num_steps'])

  return local_update


def decayed_learning_rate(
    optimizer: tff.learning.optimizers.Optimizer, decay: float,
    round_num: tf.Tensor, variables: Any) -> Optional[tf.Tensor]:
  """`lr * decay**round_num`, or None when `decay` is 1 (no override).

  `lr` is the optimizer's own learning rate; `variables` only give the
  shapes its `initialize` needs to expose its hyperparameters.
  """
  if decay == 1.0:
    return None
  return round_learning_rate(optimizer, decay, round_num, variables)


def round_learning_rate(
    optimizer: tff.learning.optimizers.Optimizer, decay: float,
    round_num: tf.Tensor, variables: Any) -> tf.Tensor:
  """The client learning rate of round `round_num`, `lr * decay**round_num`.

  Unlike `decayed_learning_rate`, always a float32 tensor (also for decay
  1), for methods whose client update divides by it (SCAFFOLD).
  """
  specs = tuple(tf.TensorSpec(v.shape, v.dtype) for v in variables)
  base = tf.convert_to_tensor(optimizer.get_hparams(
      optimizer.initialize(specs))['learning_rate'], tf.float32)
  return base * tf.pow(tf.constant(decay), tf.cast(round_num, tf.float32))


def label_counts(dataset: tf.data.Dataset, num_classes: int) -> tf.Tensor:
  """float32 [num_classes]: how many examples of each class `dataset` has.

  One pass over a batched client dataset's `y` (FedPSD's label prior,
  FedLMD's major labels).
  """
  def add(counts, batch):
    labels = tf.cast(tf.reshape(batch['y'], [-1]), tf.int32)
    return counts + tf.math.bincount(labels, minlength=num_classes,
                                     maxlength=num_classes, dtype=tf.float32)
  return dataset.reduce(tf.zeros([num_classes], tf.float32), add)


def model_delta(start: Any, final: Any) -> ModelWeights:
  """The upload of delta-based methods.

  `trainable` is the pseudo-gradient `start - final` (TFF's sign convention:
  the server optimizer applies it as descent); `non_trainable` carries the
  client's final non-trainable values (BatchNorm statistics), which the
  server averages (`finalizers.build_optimizer_and_average_finalizer`).
  """
  return ModelWeights(
      trainable=[s - f for s, f in zip(start.trainable, final.trainable)],
      non_trainable=list(final.non_trainable))


def own_statistics_once_trained(own: Any, server: Any,
                                num_participations: Any) -> list[Any]:
  """A client's own non-trainable weights (BatchNorm statistics), or any
  tensors it keeps in place of the server's, once it has trained
  (`num_participations > 0`), else the server's.

  For methods that keep statistics on the client (FedBN's treatment): a
  first-time client has none of its own yet. Takes tensors or numpy arrays
  (evaluation passes numpy client states) and returns tensors.
  """
  trained = tf.convert_to_tensor(num_participations) > 0
  return local_training.select(trained, list(own), list(server))


def zeros_like_weights(weights: Any) -> ModelWeights:
  return tf.nest.map_structure(tf.zeros_like, ModelWeights(
      trainable=list(weights.trainable),
      non_trainable=list(weights.non_trainable)))
