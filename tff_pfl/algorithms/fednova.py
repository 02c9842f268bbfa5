"""FedNova (Wang et al., NeurIPS 2020): normalized averaging.

Clients that take different numbers of local steps tau_i (unequal data
sizes, batches or epochs) pull FedAvg's average towards the objective of the
clients that step most. FedNova normalizes each client's change by its
(momentum-adjusted) step count before averaging. Client i, from the global
weights x, trains to y_i and uploads

    d_i = (x - y_i) / a_i  and  a_i = [tau_i - rho (1 - rho^tau_i)/(1 - rho)]
                                      / (1 - rho)

(the normalized update of Wang et al., with a_i for SGD with momentum
as in the paper and in the FedNTD code base; rho = 0 gives a_i = tau_i, the
local steps counted as batches x epochs). The server
computes, with p_i = n_i / sum_j n_j over the sampled clients,

    x <- x - tau_eff sum_i p_i d_i,   tau_eff = sum_i p_i a_i

(FedNova's server step with its default tau_eff). Here the upload is the
struct `NovaUpdate(normalized, steps)` averaged by one example-weighted
`MeanFactory` (giving sum_i p_i d_i and tau_eff together), and the finalizer
rescales the mean normalized update by the mean a and applies it with the
server optimizer through `finalizers.build_optimizer_and_average_finalizer`
(SGD at 1.0 gives exactly the step above). With the same tau_i on every
client FedNova equals FedAvg (tested). BatchNorm statistics are not
normalized: they ride along in `normalized.non_trainable` and are averaged
as in FedAvg.

a_i depends on the client optimizer's momentum, which is read off the
optimizer (`momentum=None`, default) or, if given, checked against it. A
client with non-finite training uploads zeros with weight 0. FedNova has
no personalized model: clients are evaluated with the global model.
"""

from typing import Any, NamedTuple, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_pfl.algorithms import fedavg
from tff_pfl.core import model_spec as model_spec_lib
from tff_pfl.core import process as process_lib
from tff_pfl.templates import client_works
from tff_pfl.templates import finalizers
from tff_pfl.templates import local_steps
from tff_pfl.templates import local_training

ModelWeights = tff.learning.models.ModelWeights


class NovaUpdate(NamedTuple):
  """A FedNova upload.

  Attributes:
    normalized: `ModelWeights`: trainable d_i = (x - y_i) / a_i, and the
      final non-trainable (BatchNorm) values, not normalized.
    steps: a_i, the momentum-adjusted number of local steps (float32).
  """
  normalized: Any
  steps: Any


def build_fednova_finalizer(
    server_optimizer: tff.learning.optimizers.Optimizer,
    weights_type: tff.Type,
) -> tff.learning.templates.FinalizerProcess:
  """Rescales the mean `NovaUpdate` by tau_eff, then the usual finalizer.

  The aggregate is `NovaUpdate(normalized=sum_i p_i d_i, steps=tau_eff)`;
  the wrapped `build_optimizer_and_average_finalizer` receives
  `ModelWeights(trainable=tau_eff * sum_i p_i d_i, non_trainable=mean BN)`.
  """
  inner = finalizers.build_optimizer_and_average_finalizer(server_optimizer,
                                                           weights_type)
  update_type = tff.types.tensorflow_to_type(NovaUpdate(
      normalized=weights_type, steps=tff.TensorType(np.float32)))

  @tff.tensorflow.computation(update_type)
  def rescale(mean):
    return ModelWeights(
        trainable=[mean.steps * d for d in mean.normalized.trainable],
        non_trainable=list(mean.normalized.non_trainable))

  @tff.federated_computation(
      inner.initialize.type_signature.result,
      tff.FederatedType(weights_type, tff.SERVER),
      tff.FederatedType(update_type, tff.SERVER))
  def next_fn(state, weights, aggregate):
    out = inner.next(state, weights, tff.federated_map(rescale, aggregate))
    return tff.templates.MeasuredProcessOutput(
        state=out.state, result=out.result, measurements=out.measurements)

  return tff.learning.templates.FinalizerProcess(inner.initialize, next_fn)


def build_fednova(
    spec: model_spec_lib.ModelSpec,
    *,
    initial_weights: tff.learning.models.ModelWeights,
    client_optimizer: tff.learning.optimizers.Optimizer,
    server_optimizer: Optional[tff.learning.optimizers.Optimizer] = None,
    local_epochs: int = 1,
    learning_rate_decay: float = 1.0,
    momentum: Optional[float] = None,
) -> process_lib.PersonalizedProcess:
  """Builds FedNova; see the module docstring.

  Args:
    spec: model spec.
    initial_weights: seeded initial global weights.
    client_optimizer: TFF optimizer for local training.
    server_optimizer: applies tau_eff * sum_i p_i d_i; default SGD at 1.0.
    local_epochs: local epochs.
    learning_rate_decay: per-round client learning-rate decay.
    momentum: rho of a_i; default None reads it off the client optimizer
      (plain SGD: 0, a_i = tau_i); a given value that differs from the
      optimizer's is a ValueError.
  """
  momentum = local_steps.check_momentum(client_optimizer, initial_weights,
                                        momentum, 'FedNova')
  if server_optimizer is None:
    server_optimizer = tff.learning.optimizers.build_sgdm(learning_rate=1.0)
  local_update = client_works.build_local_update(
      spec, client_optimizer, epochs=local_epochs,
      learning_rate_decay=learning_rate_decay)
  weights_type = spec.weights_type()
  broadcast_type = process_lib.broadcast_type(weights_type)
  state_type = tff.types.tensorflow_to_type(fedavg.FedAvgClientState(
      num_participations=tff.TensorType(np.int32)))

  @tf.function
  def train(model, start, dataset, round_num):
    result = local_update(model, start, dataset, round_num)
    steps = local_steps.effective_steps(result.num_steps, momentum)
    return result, steps

  @tff.tensorflow.computation(broadcast_type, state_type, spec.data_type())
  def update(broadcast, state, dataset):
    model = spec.keras_model_fn()
    start = process_lib._as_model_weights(broadcast.model_weights)  # pylint: disable=protected-access
    result, steps = train(model, start, dataset, broadcast.round_num)
    delta = client_works.model_delta(start, result.weights)
    ok = tf.logical_and(result.finite, steps > 0.0)
    normalized = ModelWeights(
        trainable=[d / tf.maximum(steps, 1e-12) for d in delta.trainable],
        non_trainable=list(delta.non_trainable))
    upload = local_training.select(
        ok, NovaUpdate(normalized=normalized, steps=steps),
        NovaUpdate(normalized=client_works.zeros_like_weights(start),
                   steps=tf.constant(0.0)))
    weight = tf.where(ok, result.metrics['num_examples'], 0.0)
    return process_lib.ClientOutput(
        upload, weight,
        fedavg.FedAvgClientState(
            state.num_participations + tf.cast(ok, tf.int32)),
        result.metrics,
        local_model=local_training.select(ok, result.weights, start))

  def initial_state(client_id: str) -> fedavg.FedAvgClientState:
    del client_id
    return fedavg.FedAvgClientState(np.int32(0))

  work = process_lib.ClientWork(update=update, state_type=state_type,
                                initial_state=initial_state)
  return process_lib.compose_with_global_model(
      spec, initial_weights, work,
      finalizer=build_fednova_finalizer(server_optimizer, weights_type),
      name='fednova')
