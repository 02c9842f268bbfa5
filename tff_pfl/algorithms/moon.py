"""MOON: model-contrastive federated learning (Li, He and Song, CVPR 2021).

FedAvg with a contrastive term in the local objective. Client k receives the
global model w^t and keeps its local model of its previous participation
w_k^prev (client state). It trains a copy w of w^t on

    l = CE(w; x, y) + mu * l_con(z, z_glob, z_prev)   (MOON's local objective)
    l_con = -log( exp(sim(z, z_glob)/tau)
                  / (exp(sim(z, z_glob)/tau) + exp(sim(z, z_prev)/tau)) )

where z, z_glob and z_prev are the representations of the batch under w,
the frozen w^t and the frozen w_k^prev, and sim is the cosine similarity
(`templates.contrastive`). It uploads w^t - w, averaged as FedAvg, and keeps
w as its new w_k^prev. Each client is evaluated with the global model, like
FedAvg (MOON has no personalized model).

Design decisions:
* Representation: the output of the model's 'encoder' sub-model
  (`keras_models.build_model`), i.e. the input of the linear head. MOON's
  code contrasts the output of an extra 2-layer projection head (out_dim 256)
  that is not part of our models; FedNTD's MOON implementation
  (Lee-Gihun/FedNTD, algorithms/moon) also uses the penultimate features.
  The frozen models run with `training=False`, as MOON's `eval()` copies.
* A client seen for the first time has no previous model: it uses the
  current global model w^t as w_k^prev. Then z_glob == z_prev, so
  l_con = log 2 for every batch and its gradient is 0: a client's first
  participation is exactly a FedAvg update (tested). MOON's code behaves the
  same in round 0 (its model pool is empty, so the contrastive logits are
  the positive one alone and the loss is constant); later it uses stale
  per-party models, and FedNTD's implementation the initial global model.
* Only one previous model is kept (MOON's default `model_buffer_size=1`).
* mu = 0 is FedAvg (tested). If a client's training diverges, its update is
  dropped (weight 0) and its state is unchanged: a first-time client stays
  first-time and uses the global model as its previous one next time.

Defaults: tau = 0.5 (MOON paper and code, `--temperature 0.5`), mu = 1
(MOON code default `--mu 1`; the paper reports mu = 5 best for CIFAR-10 and
mu = 1 for CIFAR-100 and Tiny-ImageNet, and FedNTD's CIFAR-10 config uses
mu = 0.1). The metric `contrastive_loss` is the per-example mean of the
weighted term mu * l_con on each client.
"""

import collections
from typing import Any, NamedTuple, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_pfl.core import model_spec as model_spec_lib
from tff_pfl.core import process as process_lib
from tff_pfl.templates import client_works
from tff_pfl.templates import contrastive
from tff_pfl.templates import local_training

ModelWeights = tff.learning.models.ModelWeights


class MOONClientState(NamedTuple):
  previous_weights: Any     # w_k^prev: the local model after the last round
  num_participations: Any   # 0: no previous model yet (use the global one)


def build_moon(
    spec: model_spec_lib.ModelSpec,
    *,
    initial_weights: ModelWeights,
    client_optimizer: tff.learning.optimizers.Optimizer,
    server_optimizer: Optional[tff.learning.optimizers.Optimizer] = None,
    local_epochs: int = 1,
    learning_rate_decay: float = 1.0,
    mu: float = 1.0,
    temperature: float = 0.5,
) -> process_lib.PersonalizedProcess:
  """Builds MOON; see the module docstring.

  Args:
    spec: model spec whose Keras model has 'encoder' and 'head' sub-models.
    initial_weights: seeded initial global weights.
    client_optimizer: TFF optimizer for local training.
    server_optimizer: applied to the averaged delta; default SGD at 1.0.
    local_epochs: local epochs E.
    learning_rate_decay: per-round client learning-rate decay.
    mu: weight of the model-contrastive term, >= 0 (0 is FedAvg).
    temperature: tau > 0 of the contrastive softmax.
  """
  if not (np.isfinite(mu) and mu >= 0):
    raise ValueError(f'MOON mu must be finite and >= 0, got {mu}.')
  if not (np.isfinite(temperature) and temperature > 0):
    raise ValueError(f'MOON temperature must be finite and > 0, got '
                     f'{temperature}.')
  if local_epochs < 1:
    raise ValueError(f'local_epochs must be >= 1, got {local_epochs}.')
  if not 0.0 < learning_rate_decay <= 1.0:
    raise ValueError('learning_rate_decay must be in (0, 1], got '
                     f'{learning_rate_decay}.')
  spec.encoder_sizes('MOON')
  mu = float(mu)
  temperature = float(temperature)

  weights_type = spec.weights_type()
  broadcast_type = process_lib.broadcast_type(weights_type)
  state_type = tff.types.tensorflow_to_type(MOONClientState(
      previous_weights=weights_type,
      num_participations=tff.TensorType(np.int32)))

  @tf.function
  def client_update(local_model, global_model, previous_model, global_weights,
                    state, dataset, round_num):
    # One tf.function: the assignments and the training on the three models
    # are ordered by automatic control dependencies.
    stored = process_lib._as_model_weights(state.previous_weights)  # pylint: disable=protected-access
    previous = local_training.select(state.num_participations > 0, stored,
                                     global_weights)
    model_spec_lib.assign_weights(local_model, global_weights)
    model_spec_lib.assign_weights(global_model, global_weights)
    model_spec_lib.assign_weights(previous_model, previous)
    encoder = local_model.get_layer('encoder')
    head = local_model.get_layer('head')
    global_encoder = global_model.get_layer('encoder')
    previous_encoder = previous_model.get_layer('encoder')
    learning_rate = client_works.decayed_learning_rate(
        client_optimizer, learning_rate_decay, round_num,
        local_model.trainable_variables)

    def forward(batch):
      z = encoder(batch['x'], training=True)
      z_glob = global_encoder(batch['x'], training=False)
      z_prev = previous_encoder(batch['x'], training=False)
      l_con = contrastive.model_contrastive_loss(z, z_glob, z_prev,
                                                 temperature)
      return head(z, training=True), mu * l_con

    sums = local_training.train_model(
        spec, local_model, client_optimizer, dataset, local_epochs,
        variables=local_model.trainable_variables, forward_fn=forward,
        learning_rate=learning_rate)
    final = model_spec_lib.read_weights(local_model)
    finite = tf.logical_and(
        local_training.all_finite(final),
        tf.logical_and(tf.math.is_finite(sums['loss_sum']),
                       tf.math.is_finite(sums['extra_sum'])))
    delta = local_training.select(
        finite, client_works.model_delta(global_weights, final),
        client_works.zeros_like_weights(global_weights))
    weight = tf.where(finite, sums['num_examples'], 0.0)
    new_state = MOONClientState(
        previous_weights=local_training.select(finite, final, stored),
        num_participations=(state.num_participations +
                            tf.cast(finite, tf.int32)))
    num = tf.maximum(sums['num_examples'], 1.0)
    metrics = collections.OrderedDict(
        loss_sum=tf.where(finite, sums['loss_sum'], 0.0),
        num_examples=sums['num_examples'],
        non_finite=1.0 - tf.cast(finite, tf.float32),
        contrastive_loss=tf.where(finite, sums['extra_sum'] / num, 0.0))
    return process_lib.ClientOutput(
        delta, weight, new_state, metrics,
        local_model=local_training.select(finite, final, global_weights))

  @tff.tensorflow.computation(broadcast_type, state_type, spec.data_type())
  def update(broadcast, state, dataset):
    return client_update(
        spec.keras_model_fn(), spec.keras_model_fn(), spec.keras_model_fn(),
        process_lib._as_model_weights(broadcast.model_weights),  # pylint: disable=protected-access
        state, dataset, broadcast.round_num)

  def initial_state(client_id: str) -> MOONClientState:
    # The stored weights are a placeholder until the first participation
    # (num_participations == 0 selects the global model instead).
    del client_id
    return MOONClientState(tf.nest.map_structure(np.copy, initial_weights),
                           np.int32(0))

  work = process_lib.ClientWork(update=update, state_type=state_type,
                                initial_state=initial_state)
  return process_lib.compose_with_global_model(
      spec, initial_weights, work, server_optimizer=server_optimizer,
      name='moon')
