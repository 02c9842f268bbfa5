"""FedAvg (McMahan et al., 2017) on the personalized core.

Each sampled client starts from the global weights w_t, runs E local epochs
of mini-batch SGD on its data, and uploads the pseudo-gradient
Delta_k = w_t - w_k; the server averages the deltas weighted by the clients'
example counts n_k and applies them with the server optimizer:

    w_{t+1} = ServerOpt(w_t, sum_k n_k Delta_k / sum_k n_k)

(with SGD at learning rate 1 this is w_{t+1} = sum_k n_k w_k / sum_k n_k).
This is exactly `tff.learning.algorithms.build_weighted_fed_avg` (the
equivalence is tested in `tests/tff_pfl/algorithms/fedavg_test.py`), with one
deliberate difference: BatchNorm moving statistics (non-trainable weights)
are averaged over clients too, where TFF leaves them at their initial values.

FedAvg has no personalized model: each client is evaluated with the global
model on its own test split, as the papers report it.
"""

from typing import Any, NamedTuple, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_pfl.core import model_spec as model_spec_lib
from tff_pfl.core import process as process_lib
from tff_pfl.templates import client_works
from tff_pfl.templates import local_training


class FedAvgClientState(NamedTuple):
  """FedAvg keeps nothing but a participation count per client (rounds
  whose training finished; a diverged one is not counted)."""
  num_participations: Any


def build_fedavg_client_work(
    spec: model_spec_lib.ModelSpec,
    optimizer: tff.learning.optimizers.Optimizer,
    *,
    local_epochs: int,
    learning_rate_decay: float = 1.0,
    extra_loss_fn: Optional[Any] = None,
) -> process_lib.ClientWork:
  """The FedAvg client: train from the global weights, upload the delta.

  `extra_loss_fn` (see `client_works.build_local_update`) lets delta-based
  methods that only change the local objective (FedProx) reuse this client.
  """
  local_update = client_works.build_local_update(
      spec, optimizer, epochs=local_epochs,
      learning_rate_decay=learning_rate_decay, extra_loss_fn=extra_loss_fn)
  weights_type = spec.weights_type()
  broadcast_type = process_lib.broadcast_type(weights_type)
  state_type = tff.types.tensorflow_to_type(
      FedAvgClientState(num_participations=tf.TensorSpec([], tf.int32)))

  @tff.tensorflow.computation(broadcast_type, state_type, spec.data_type())
  def update(broadcast, state, dataset):
    model = spec.keras_model_fn()
    start = process_lib._as_model_weights(broadcast.model_weights)  # pylint: disable=protected-access
    result = local_update(model, start, dataset, broadcast.round_num)
    delta = local_training.select(
        result.finite, client_works.model_delta(start, result.weights),
        client_works.zeros_like_weights(start))
    weight = tf.where(result.finite, result.metrics['num_examples'], 0.0)
    new_state = FedAvgClientState(
        state.num_participations + tf.cast(result.finite, tf.int32))
    return process_lib.ClientOutput(
        delta, weight, new_state, result.metrics,
        local_model=local_training.select(result.finite, result.weights,
                                          start))

  def initial_state(client_id: str) -> FedAvgClientState:
    del client_id
    return FedAvgClientState(np.int32(0))

  return process_lib.ClientWork(update=update, state_type=state_type,
                                initial_state=initial_state)


def build_fedavg(
    spec: model_spec_lib.ModelSpec,
    *,
    initial_weights: tff.learning.models.ModelWeights,
    client_optimizer: tff.learning.optimizers.Optimizer,
    server_optimizer: Optional[tff.learning.optimizers.Optimizer] = None,
    local_epochs: int = 1,
    learning_rate_decay: float = 1.0,
    aggregator_factory: Optional[
        tff.aggregators.WeightedAggregationFactory] = None,
) -> process_lib.PersonalizedProcess:
  """Builds FedAvg.

  Args:
    spec: model spec.
    initial_weights: seeded initial global weights (`spec.initial_weights`).
    client_optimizer: TFF optimizer for local training.
    server_optimizer: TFF optimizer applying the averaged delta; default
      SGD with learning rate 1.0 (plain averaging), as TFF's default.
    local_epochs: local epochs E.
    learning_rate_decay: per-round client learning-rate decay.
    aggregator_factory: weighted aggregation of the deltas; default
      `tff.aggregators.MeanFactory()` (example-count weighted mean).
  """
  work = build_fedavg_client_work(
      spec, client_optimizer, local_epochs=local_epochs,
      learning_rate_decay=learning_rate_decay)
  return process_lib.compose_with_global_model(
      spec, initial_weights, work, server_optimizer=server_optimizer,
      aggregator_factory=aggregator_factory, name='fedavg')
