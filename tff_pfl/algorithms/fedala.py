"""FedALA (Zhang et al., AAAI 2023) on the personalized core.

J. Zhang, Y. Hua, H. Wang, T. Song, Z. Xue, R. Ma, H. Guan, "FedALA:
Adaptive Local Aggregation for Personalized Federated Learning", AAAI 2023
(arXiv:2212.01197); reference code TsingZ0/FedALA and PFLlib
(`utils/ALA.py`, `clientala.py`).

Each client k keeps a local model theta_k and aggregation weights W_k. When
sampled in round t with global model theta (the broadcast), it

1. initializes its model by Adaptive Local Aggregation (ALA): the lower
   trainable tensors (all but the top `layer_idx`) are taken from theta,
   the non-trainable ones (BatchNorm statistics) stay theta_k's (the
   reference code mixes `parameters()` only and leaves BatchNorm buffers
   local), and each top tensor p is aggregated element-wise,

       theta_hat_p = theta_k,p + (theta_p - theta_k,p) * W_k,p,

   with W_k learned on `rand_percent`% of the client's training batches by

       W_k,p <- clip(W_k,p - eta * grad_{theta_hat_p} L(theta_hat)
                     * (theta_p - theta_k,p), 0, 1)

   (one step per batch, theta_hat recomputed after each). In the client's
   first ALA (the start phase) passes repeat until the std of the last
   `num_pre_loss` pass losses is below `threshold`, at most
   `max_start_iterations` passes (a cap PFLlib does not have); later ALAs
   do one pass. The first time a client receives the global model there is
   no ALA: its local model is a copy of theta (PFLlib skips ALA while the
   local model equals the global one). See
   `tff_pfl.templates.adaptive_local_aggregation`.
2. trains theta_hat for `local_epochs` epochs (`local_training.train_model`)
   and keeps the result as its new theta_k;
3. uploads theta - theta_k, weighted by its example count, which the server
   averages and applies as FedAvg does (so the global model is FedAvg's
   global model with ALA-initialized local training).

Defaults follow the paper and its reference code: eta = 1.0,
rand_percent (s) = 80, layer_idx (p) = 2 (the head's kernel and bias: PFLlib
counts parameter tensors), num_pre_loss = 10, threshold = 0.01 (the
reference `ALA` class defaults to 0.1; pass `threshold=0.1` to match it).

Evaluation: the personal model of a client is its stored theta_k (the model
it trained last), or the global model for a client that never received one.
PFLlib sends the global model to *every* client at the start of each round,
runs ALA there and evaluates the ALA-initialized model before training. We
evaluate the stored model instead because ALA needs the client's training
data and changes its state (W, start phase), while `evaluate` sees only the
evaluation split and returns no client state; also only sampled clients
run ALA here, where PFLlib runs it for all clients every round.

A client whose local training produced non-finite values uploads a
zero delta with weight 0 and keeps its previous state unchanged
(`num_participations` included), as FedAvg drops it.
"""

from typing import Any, NamedTuple, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_pfl.core import model_spec as model_spec_lib
from tff_pfl.core import process as process_lib
from tff_pfl.templates import adaptive_local_aggregation as ala_lib
from tff_pfl.templates import client_works
from tff_pfl.templates import local_training

ModelWeights = tff.learning.models.ModelWeights


def _model_weights(value: Any) -> ModelWeights:
  """`ModelWeights` with list fields from a TFF-converted weights struct."""
  return ModelWeights(trainable=list(value.trainable),
                      non_trainable=list(value.non_trainable))


class FedALAClientState(NamedTuple):
  """FedALA's per-client state.

  Attributes:
    model_weights: the client's local model (`ModelWeights`), the one it
      trained last (the initial weights until it first takes part).
    ala_weights: list of float32 tensors W, one per top trainable tensor,
      same shapes; ones initially.
    start_phase: int32, 1 until the client's first ALA has run.
    initialized: int32, 0 until the client has received a global model.
    num_participations: int32, rounds the client took part in whose
      training finished (a diverged one is not counted).
  """
  model_weights: Any
  ala_weights: Any
  start_phase: Any
  initialized: Any
  num_participations: Any


def build_fedala_client_work(
    spec: model_spec_lib.ModelSpec,
    optimizer: tff.learning.optimizers.Optimizer,
    *,
    initial_weights: ModelWeights,
    local_epochs: int,
    learning_rate_decay: float = 1.0,
    eta: float = 1.0,
    rand_percent: float = 80,
    layer_idx: int = 2,
    threshold: float = 0.01,
    num_pre_loss: int = 10,
    max_start_iterations: int = 100,
) -> process_lib.ClientWork:
  """The FedALA client: ALA, local training, upload of the delta.

  Args:
    spec: model spec.
    optimizer: TFF client optimizer for local training.
    initial_weights: seeded initial weights (NumPy `ModelWeights`), the
      local model of a client before it first takes part.
    local_epochs: local epochs E.
    learning_rate_decay: per-round client learning-rate decay.
    eta: learning rate of the ALA weights W.
    rand_percent: percentage of the client's batches used to learn W.
    layer_idx: number of top trainable tensors aggregated with W.
    threshold: start-phase convergence threshold.
    num_pre_loss: number of pass losses in the convergence std.
    max_start_iterations: cap on the passes of the start phase.

  Returns:
    A `ClientWork` with state `FedALAClientState`.
  """
  ala = ala_lib.build_adaptive_local_aggregation(
      spec, layer_idx=layer_idx, eta=eta, rand_percent=rand_percent,
      threshold=threshold, num_pre_loss=num_pre_loss,
      max_start_iterations=max_start_iterations)
  local_update = client_works.build_local_update(
      spec, optimizer, epochs=local_epochs,
      learning_rate_decay=learning_rate_decay)
  weights_type = spec.weights_type()
  top_types = list(weights_type.trainable)[-layer_idx:]
  broadcast_type = process_lib.broadcast_type(weights_type)
  state_type = tff.types.tensorflow_to_type(FedALAClientState(
      model_weights=weights_type,
      ala_weights=[tff.TensorType(np.float32, t.shape) for t in top_types],
      start_phase=tff.TensorType(np.int32),
      initialized=tff.TensorType(np.int32),
      num_participations=tff.TensorType(np.int32)))

  @tf.function
  def client_update(model, global_weights, state, dataset, round_num):
    local_weights = _model_weights(state.model_weights)
    ala_weights = [tf.identity(w) for w in state.ala_weights]

    def with_ala():
      out = ala(model, global_weights, local_weights, ala_weights, dataset,
                state.start_phase > 0)
      return out.weights, list(out.ala_weights), out.num_passes > 0

    def first_receive():
      return global_weights, ala_weights, tf.constant(False)

    start, learned_w, ala_ran = tf.cond(
        state.initialized > 0, with_ala, first_receive)
    result = local_update(model, start, dataset, round_num)
    finite = result.finite
    delta = local_training.select(
        finite, client_works.model_delta(global_weights, result.weights),
        client_works.zeros_like_weights(global_weights))
    weight = tf.where(finite, result.metrics['num_examples'], 0.0)
    kept = local_training.select(finite, result.weights, local_weights)
    new_state = FedALAClientState(
        model_weights=kept,
        ala_weights=local_training.select(finite, learned_w, ala_weights),
        start_phase=tf.where(tf.logical_and(finite, ala_ran), 0,
                             state.start_phase),
        initialized=tf.where(finite, 1, state.initialized),
        num_participations=(state.num_participations +
                            tf.cast(finite, tf.int32)))
    return process_lib.ClientOutput(
        delta, weight, new_state, result.metrics,
        local_model=local_training.select(finite, result.weights, start))

  @tff.tensorflow.computation(broadcast_type, state_type, spec.data_type())
  def update(broadcast, state, dataset):
    model = spec.keras_model_fn()
    global_weights = _model_weights(broadcast.model_weights)
    return client_update(model, global_weights, state, dataset,
                         broadcast.round_num)

  def initial_state(client_id: str) -> FedALAClientState:
    del client_id
    return FedALAClientState(
        model_weights=tf.nest.map_structure(np.copy, initial_weights),
        ala_weights=[np.ones(t.shape, np.float32) for t in top_types],
        start_phase=np.int32(1),
        initialized=np.int32(0),
        num_participations=np.int32(0))

  def personal_weights(global_weights, client_state):
    local = _model_weights(client_state.model_weights)
    return local_training.select(
        client_state.initialized > 0, local,
        _model_weights(global_weights))

  return process_lib.ClientWork(
      update=update, state_type=state_type, initial_state=initial_state,
      personal_weights=personal_weights)


def build_fedala(
    spec: model_spec_lib.ModelSpec,
    *,
    initial_weights: ModelWeights,
    client_optimizer: tff.learning.optimizers.Optimizer,
    server_optimizer: Optional[tff.learning.optimizers.Optimizer] = None,
    local_epochs: int = 1,
    learning_rate_decay: float = 1.0,
    eta: float = 1.0,
    rand_percent: float = 80,
    layer_idx: int = 2,
    threshold: float = 0.01,
    num_pre_loss: int = 10,
    max_start_iterations: int = 100,
) -> process_lib.PersonalizedProcess:
  """Builds FedALA.

  Args:
    spec: model spec.
    initial_weights: seeded initial global weights (`spec.initial_weights`).
    client_optimizer: TFF optimizer for local training.
    server_optimizer: TFF optimizer applying the averaged delta; default
      SGD with learning rate 1.0 (plain averaging), as in the paper.
    local_epochs: local epochs E.
    learning_rate_decay: per-round client learning-rate decay.
    eta: learning rate of the ALA weights W, > 0 (paper: 1.0).
    rand_percent: percentage of a client's training batches used to learn
      W, in (0, 100] (paper: s = 80).
    layer_idx: number of top trainable tensors aggregated with W, in
      [1, number of trainable tensors] (paper code: 2, the head's kernel
      and bias). The lower tensors are taken from the global model.
    threshold: the start phase ends when the std of the last
      `num_pre_loss` pass losses is below it, > 0.
    num_pre_loss: number of pass losses in that std, >= 1 (paper code: 10).
    max_start_iterations: the most passes of the start phase, >= 1; a cap
      PFLlib does not have.

  Returns:
    A `PersonalizedProcess` named 'fedala'.

  Raises:
    ValueError: for an invalid hyperparameter (the message names it).
  """
  ala_lib.validate_hyperparameters(
      num_trainable=ala_lib.num_trainable_tensors(spec), layer_idx=layer_idx,
      eta=eta, rand_percent=rand_percent, threshold=threshold,
      num_pre_loss=num_pre_loss, max_start_iterations=max_start_iterations)
  work = build_fedala_client_work(
      spec, client_optimizer, initial_weights=initial_weights,
      local_epochs=local_epochs, learning_rate_decay=learning_rate_decay,
      eta=eta, rand_percent=rand_percent, layer_idx=layer_idx,
      threshold=threshold, num_pre_loss=num_pre_loss,
      max_start_iterations=max_start_iterations)
  return process_lib.compose_with_global_model(
      spec, initial_weights, work, server_optimizer=server_optimizer,
      name='fedala')
