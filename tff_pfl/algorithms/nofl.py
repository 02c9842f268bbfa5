"""No-FL: every client trains only on its own data (the papers' local baseline).

Client k keeps a personal model w_k (its client state), initialised to the
same seeded initial weights as the federated methods, and in each round it
takes part runs E local epochs from w_k. Nothing is uploaded and nothing is
aggregated; the process has no global model. A client is evaluated with its
own w_k on its own test split. With all clients sampled every round, R rounds
of No-FL are R*E epochs of purely local training per client.
"""

from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_pfl.core import model_spec as model_spec_lib
from tff_pfl.core import process as process_lib
from tff_pfl.templates import client_works
from tff_pfl.templates import local_training


class NoFLClientState(NamedTuple):
  model_weights: Any          # the personal model (ModelWeights)
  num_participations: Any


def build_nofl(
    spec: model_spec_lib.ModelSpec,
    *,
    initial_weights: tff.learning.models.ModelWeights,
    client_optimizer: tff.learning.optimizers.Optimizer,
    local_epochs: int = 1,
    learning_rate_decay: float = 1.0,
) -> process_lib.PersonalizedProcess:
  """Builds No-FL (local training only). Arguments as in `build_fedavg`."""
  local_update = client_works.build_local_update(
      spec, client_optimizer, epochs=local_epochs,
      learning_rate_decay=learning_rate_decay)
  weights_type = spec.weights_type()
  broadcast_type = process_lib.broadcast_type(weights_type)
  state_type = tff.types.tensorflow_to_type(NoFLClientState(
      model_weights=weights_type,
      num_participations=tff.TensorType(np.int32)))

  @tff.tensorflow.computation(broadcast_type, state_type, spec.data_type())
  def update(broadcast, state, dataset):
    model = spec.keras_model_fn()
    start = process_lib._as_model_weights(state.model_weights)  # pylint: disable=protected-access
    result = local_update(model, start, dataset, broadcast.round_num)
    # A client whose training diverged keeps its previous model.
    kept = local_training.select(result.finite, result.weights, start)
    new_state = NoFLClientState(
        kept, state.num_participations + tf.cast(result.finite, tf.int32))
    return process_lib.ClientOutput((), tf.constant(0.0), new_state,
                                    result.metrics, local_model=kept)

  def initial_state(client_id: str) -> NoFLClientState:
    del client_id
    return NoFLClientState(
        tf.nest.map_structure(np.copy, initial_weights), np.int32(0))

  def personal_weights(global_weights, client_state):
    del global_weights
    return client_state.model_weights

  work = process_lib.ClientWork(
      update=update, state_type=state_type, initial_state=initial_state,
      personal_weights=personal_weights)
  return process_lib.compose_personalized_process(
      spec, initial_weights, work, name='nofl')
