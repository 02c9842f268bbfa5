"""Shared body, personal head: the client side of FedPer and FedRep.

The model's trainable tensors are `body + head` (the head's come last, see
`ModelSpec.num_head_variables`). The client keeps its head in its state and
starts each round from `global body + own head`; after local training it
uploads the body's pseudo-gradient and a zero delta for the head, so the
global head never changes and is never used: every client is evaluated with
`global body + own head`. (Uploading a zero head delta instead of a
body-only structure keeps one aggregator and finalizer for all delta-based
methods; the cost is simulated bandwidth only.)

Non-trainable weights (BatchNorm moving statistics) belong to the body and
are averaged like FedAvg's. With `local_statistics=True` each client also
keeps its own: its state holds them, and it starts its round and is
evaluated with them instead of the global average (a first-time client
takes the global ones). This is what PFLlib's FedPer/FedRep do (they copy
and average `parameters()` only, so BatchNorm buffers never leave the
client), and what FedBN argues for under feature shift. The uploaded
statistics still go into the (never evaluated) global model.

`train_fn(model, start_weights, dataset, round_num) -> LocalResult` is the
method's local schedule: FedPer trains body and head together, FedRep the
head first and then the body.
"""

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_pfl.core import model_spec as model_spec_lib
from tff_pfl.core import process as process_lib
from tff_pfl.templates import client_works
from tff_pfl.templates import local_training

ModelWeights = tff.learning.models.ModelWeights


class PersonalHeadState(NamedTuple):
  head: Any                 # list of the head's trainable tensors
  num_participations: Any


class PersonalHeadStatisticsState(NamedTuple):
  """`PersonalHeadState` plus the client's own non-trainable weights."""
  head: Any
  statistics: Any           # list of the model's non-trainable tensors
  num_participations: Any


def with_head(weights: Any, head: Any, num_head: int) -> ModelWeights:
  """`weights` with its last `num_head` trainable tensors replaced."""
  trainable = list(weights.trainable)
  return ModelWeights(trainable=trainable[:-num_head] + list(head),
                      non_trainable=list(weights.non_trainable))


def _with_statistics(weights: Any, state: Any) -> ModelWeights:
  """`weights` with the client's own non-trainable weights, once it has any
  (a client that never trained keeps those of `weights`, the global
  model's)."""
  return ModelWeights(
      trainable=list(weights.trainable),
      non_trainable=client_works.own_statistics_once_trained(
          state.statistics, weights.non_trainable, state.num_participations))


def build_personal_head_client_work(
    spec: model_spec_lib.ModelSpec,
    initial_weights: ModelWeights,
    train_fn: Callable[..., client_works.LocalResult],
    *,
    local_statistics: bool = False,
) -> process_lib.ClientWork:
  """Client work of a body-shared, head-personal method (see module doc).

  Args:
    spec: the model.
    initial_weights: the initial global model (and each client's first
      head).
    train_fn: the local schedule, see the module docstring.
    local_statistics: keep each client's non-trainable weights (BatchNorm
      statistics) in its state instead of taking the global average.
  """
  num_head = spec.num_head_variables()
  weights_type = spec.weights_type()
  broadcast_type = process_lib.broadcast_type(weights_type)
  head_type = tff.types.tensorflow_to_type(
      [tf.TensorSpec(t.shape, t.dtype)
       for t in initial_weights.trainable[-num_head:]])
  if local_statistics:
    if not initial_weights.non_trainable:
      raise ValueError(
          'local_statistics=True but the model has no non-trainable weights '
          '(no BatchNorm): there are no statistics to keep local.')
    statistics_type = tff.types.tensorflow_to_type(
        [tf.TensorSpec(t.shape, t.dtype)
         for t in initial_weights.non_trainable])
    state_type = tff.types.tensorflow_to_type(PersonalHeadStatisticsState(
        head=head_type, statistics=statistics_type,
        num_participations=tff.TensorType(np.int32)))
  else:
    state_type = tff.types.tensorflow_to_type(PersonalHeadState(
        head=head_type, num_participations=tff.TensorType(np.int32)))

  def personal_weights(global_weights, client_state):
    weights = with_head(global_weights, client_state.head, num_head)
    if local_statistics:
      weights = _with_statistics(weights, client_state)
    return weights

  @tff.tensorflow.computation(broadcast_type, state_type, spec.data_type())
  def update(broadcast, state, dataset):
    model = spec.keras_model_fn()
    global_weights = process_lib._as_model_weights(broadcast.model_weights)  # pylint: disable=protected-access
    start = personal_weights(global_weights, state)
    result = train_fn(model, start, dataset, broadcast.round_num)
    delta = client_works.model_delta(start, result.weights)
    delta = with_head(delta, [tf.zeros_like(t) for t in state.head],
                      num_head)
    delta = local_training.select(result.finite, delta,
                                  client_works.zeros_like_weights(start))
    new_head = local_training.select(
        result.finite, list(result.weights.trainable[-num_head:]),
        list(state.head))
    weight = tf.where(result.finite, result.metrics['num_examples'], 0.0)
    num_participations = (state.num_participations +
                          tf.cast(result.finite, tf.int32))
    if local_statistics:
      new_statistics = local_training.select(
          result.finite, list(result.weights.non_trainable),
          list(state.statistics))
      new_state = PersonalHeadStatisticsState(
          new_head, new_statistics, num_participations)
    else:
      new_state = PersonalHeadState(new_head, num_participations)
    return process_lib.ClientOutput(
        delta, weight, new_state, result.metrics,
        local_model=local_training.select(result.finite, result.weights,
                                          start))

  def initial_state(client_id: str):
    del client_id
    head = [np.copy(t) for t in initial_weights.trainable[-num_head:]]
    if local_statistics:
      return PersonalHeadStatisticsState(
          head, [np.copy(t) for t in initial_weights.non_trainable],
          np.int32(0))
    return PersonalHeadState(head, np.int32(0))

  return process_lib.ClientWork(update=update, state_type=state_type,
                                initial_state=initial_state,
                                personal_weights=personal_weights,
                                global_model_evaluable=False)
