"""Shared body, personal head: the client side of FedPer and FedRep.

The model's trainable tensors are `body + head` (the head's come last, see
`ModelSpec.num_head_variables`). The client keeps its head in its state and
starts each round from `global body + own head`; after local training it
uploads the body's pseudo-gradient and a zero delta for the head, so the
global head never changes and is never used: every client is evaluated with
`global body + own head`. (Uploading a zero head delta instead of a
body-only structure keeps one aggregator and finalizer for all delta-based
methods; the cost is simulated bandwidth only.) Non-trainable weights (BN
statistics) belong to the body and are averaged like FedAvg's.

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


def with_head(weights: Any, head: Any, num_head: int) -> ModelWeights:
  """`weights` with its last `num_head` trainable tensors replaced."""
  trainable = list(weights.trainable)
  return ModelWeights(trainable=trainable[:-num_head] + list(head),
                      non_trainable=list(weights.non_trainable))


def build_personal_head_client_work(
    spec: model_spec_lib.ModelSpec,
    initial_weights: ModelWeights,
    train_fn: Callable[..., client_works.LocalResult],
) -> process_lib.ClientWork:
  """Client work of a body-shared, head-personal method (see module doc)."""
  num_head = spec.num_head_variables()
  weights_type = spec.weights_type()
  broadcast_type = process_lib.broadcast_type(weights_type)
  head_type = tff.types.tensorflow_to_type(
      [tf.TensorSpec(t.shape, t.dtype)
       for t in initial_weights.trainable[-num_head:]])
  state_type = tff.types.tensorflow_to_type(PersonalHeadState(
      head=head_type, num_participations=tff.TensorType(np.int32)))

  @tff.tensorflow.computation(broadcast_type, state_type, spec.data_type())
  def update(broadcast, state, dataset):
    model = spec.keras_model_fn()
    global_weights = process_lib._as_model_weights(broadcast.model_weights)  # pylint: disable=protected-access
    start = with_head(global_weights, state.head, num_head)
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
    return process_lib.ClientOutput(
        delta, weight,
        PersonalHeadState(new_head, state.num_participations + 1),
        result.metrics,
        local_model=local_training.select(result.finite, result.weights,
                                          start))

  def initial_state(client_id: str) -> PersonalHeadState:
    del client_id
    return PersonalHeadState(
        [np.copy(t) for t in initial_weights.trainable[-num_head:]],
        np.int32(0))

  def personal_weights(global_weights, client_state):
    return with_head(global_weights, client_state.head, num_head)

  return process_lib.ClientWork(update=update, state_type=state_type,
                                initial_state=initial_state,
                                personal_weights=personal_weights,
                                global_model_evaluable=False)
