"""Ditto (Li et al., ICML 2021): a global model and proximal personal models.

Each sampled client k, given the global model w^t:
  1. global step: E local epochs of SGD on F_k from w^t; upload the delta,
     aggregated as FedAvg (Ditto Algorithm 1, lines 4-5);
  2. personal step: `personal_epochs` epochs on its personal model v_k
     minimising F_k(v_k) + lambda/2 ||v_k - w^t||^2 (Ditto Eq. 3 and
     Algorithm 1, line 6), with the corrected-sign proximal term.
Client k is evaluated with v_k. lambda = 0 is plain local training of v_k
(tested); larger lambda pulls v_k towards the global model.

Default lambda = 0.1: from the Ditto paper's grid {0.05, 0.1, 0.2, 0.5, 1,
2}; some public implementations default it to 0, which makes Ditto local
training. `personal_epochs` defaults to `local_epochs`.
"""

from typing import Any, NamedTuple, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_pfl.core import model_spec as model_spec_lib
from tff_pfl.core import process as process_lib
from tff_pfl.templates import client_works
from tff_pfl.templates import local_training
from tff_pfl.templates import proximal


class DittoClientState(NamedTuple):
  personal_weights: Any       # v_k (ModelWeights)
  num_participations: Any


def build_ditto(
    spec: model_spec_lib.ModelSpec,
    *,
    initial_weights: tff.learning.models.ModelWeights,
    client_optimizer: tff.learning.optimizers.Optimizer,
    server_optimizer: Optional[tff.learning.optimizers.Optimizer] = None,
    local_epochs: int = 1,
    learning_rate_decay: float = 1.0,
    lambda_: float = 0.1,
    personal_epochs: Optional[int] = None,
) -> process_lib.PersonalizedProcess:
  """Builds Ditto; `lambda_` is the proximal pull of the personal models."""
  if lambda_ < 0:
    raise ValueError(f'Ditto lambda_ must be >= 0, got {lambda_}.')
  train_global = client_works.build_local_update(
      spec, client_optimizer, epochs=local_epochs,
      learning_rate_decay=learning_rate_decay)
  train_personal = client_works.build_local_update(
      spec, client_optimizer, epochs=personal_epochs or local_epochs,
      learning_rate_decay=learning_rate_decay,
      extra_loss_fn=(proximal.proximal_factory(lambda_) if lambda_ > 0
                     else None))
  weights_type = spec.weights_type()
  broadcast_type = process_lib.broadcast_type(weights_type)
  state_type = tff.types.tensorflow_to_type(DittoClientState(
      personal_weights=weights_type,
      num_participations=tff.TensorType(np.int32)))

  @tf.function
  def train_both(model, global_weights, personal, dataset, round_num):
    # One tf.function, so automatic control dependencies order the two
    # steps on the shared Keras variables (separate calls in the graph-mode
    # computation body would not be ordered).
    g = train_global(model, global_weights, dataset, round_num)
    p = train_personal(model, personal, dataset, round_num,
                       anchor=global_weights)
    return g, p

  @tff.tensorflow.computation(broadcast_type, state_type, spec.data_type())
  def update(broadcast, state, dataset):
    model = spec.keras_model_fn()
    global_weights = process_lib._as_model_weights(broadcast.model_weights)  # pylint: disable=protected-access
    personal = process_lib._as_model_weights(state.personal_weights)  # pylint: disable=protected-access
    g, p = train_both(model, global_weights, personal, dataset,
                      broadcast.round_num)
    # A client whose global OR personal training diverged is a diverged
    # client (its `non_finite` is 1): it uploads nothing and keeps its
    # state, personal model and participation count included.
    ok = tf.logical_and(g.finite, p.finite)
    delta = local_training.select(
        ok, client_works.model_delta(global_weights, g.weights),
        client_works.zeros_like_weights(global_weights))
    new_personal = local_training.select(ok, p.weights, personal)
    metrics = p.metrics.copy()      # the personal objective's task loss
    metrics['non_finite'] = 1.0 - tf.cast(ok, tf.float32)
    weight = tf.where(ok, g.metrics['num_examples'], 0.0)
    return process_lib.ClientOutput(
        delta, weight,
        DittoClientState(
            new_personal,
            state.num_participations + tf.cast(ok, tf.int32)),
        metrics,
        # Eq. 10 of FedPSD: the model that is about to be aggregated.
        local_model=local_training.select(ok, g.weights, global_weights))

  def initial_state(client_id: str) -> DittoClientState:
    del client_id
    return DittoClientState(tf.nest.map_structure(np.copy, initial_weights),
                            np.int32(0))

  def personal_weights(global_weights, client_state):
    del global_weights
    return client_state.personal_weights

  work = process_lib.ClientWork(update=update, state_type=state_type,
                                initial_state=initial_state,
                                personal_weights=personal_weights)
  return process_lib.compose_with_global_model(
      spec, initial_weights, work, server_optimizer=server_optimizer,
      name='ditto')
