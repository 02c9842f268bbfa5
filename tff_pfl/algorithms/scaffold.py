"""SCAFFOLD (Karimireddy et al., ICML 2020) with option-II control variates.

The server keeps the global model x and a control variate c; client i keeps
its own control variate c_i (zeros before its first round). In a round
(SCAFFOLD Algorithm 1), each sampled client i

  1. receives (x, c) and starts from y_i = x;
  2. takes K local steps with the corrected gradient
         y_i <- y_i - lr (g_i(y_i) - c_i + c)                  (line 10)
     implemented as the extra loss term sum_v <c - c_i, v> over the
     trainable variables v, whose gradient is exactly c - c_i, so that it
     runs in the one training loop (`local_training.train_model`) and with
     any client optimizer (momentum SGD included);
  3. updates its control variate with option II
         c_i+ = c_i - c + (x - y_i) / (K lr)                   (line 12)
     where lr is the client learning rate of this round (with per-round
     decay) and K the number of local steps, counted as batches x epochs;
  4. uploads (delta y_i, delta c_i) = (x - y_i, c_i+ - c_i)    (line 13)
     (the model part in TFF's pseudo-gradient sign convention).

The server (lines 16-17) applies the example-weighted mean of delta y_i with
the server optimizer (SGD at learning rate 1 gives x <- x - mean(x - y_i),
i.e. the paper's x <- x + eta_g mean(delta y) with eta_g = 1) and updates
    c <- c + (1/N) sum_{i in S} delta c_i,
N being the number of registered clients (`num_clients`, from the
registry's `run_context`). The paper averages delta y uniformly over S; we
weight by example counts as FedAvg does (equal on equal-sized shards).
BatchNorm statistics are averaged (`finalizers`), not corrected.

Momentum: with heavy-ball momentum rho, (x - y_i) / (K lr) overestimates
the mean corrected gradient by up to 1 / (1 - rho). K is therefore
replaced by the momentum-adjusted step count a(K, rho) of `local_steps` (the
FedNTD code base's "adaptive division", on by default there); rho is read
off the client optimizer (`momentum=None`, default) or, if given, checked
against it. With plain SGD (rho = 0) this is the paper's option II.

A client whose training or control variate is not finite uploads zeros with
weight 0 and keeps its c_i. SCAFFOLD has no personalized model: clients are
evaluated with the global model.
"""

from typing import Any, NamedTuple, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_pfl.core import model_spec as model_spec_lib
from tff_pfl.core import process as process_lib
from tff_pfl.templates import client_works
from tff_pfl.templates import local_steps
from tff_pfl.templates import local_training
from tff_pfl.templates import server_control


class ScaffoldClientState(NamedTuple):
  """Client i's control variate c_i (one tensor per trainable weight)."""
  control: Any
  num_participations: Any


def correction_factory(correction: Any) -> local_training.ExtraLossFn:
  """The extra loss sum_v <c - c_i, v>, whose gradient is c - c_i.

  Used as `build_local_update`'s `extra_loss_fn`: the call's `anchor`
  carries the correction c - c_i, one tensor per trainable variable.
  """
  def extra_loss(model, batch, outputs):
    del batch, outputs
    return tf.add_n([
        tf.reduce_sum(tf.stop_gradient(tf.cast(c, v.dtype)) * v)
        for v, c in zip(model.trainable_variables, correction)])
  return extra_loss


def build_scaffold(
    spec: model_spec_lib.ModelSpec,
    *,
    initial_weights: tff.learning.models.ModelWeights,
    client_optimizer: tff.learning.optimizers.Optimizer,
    server_optimizer: Optional[tff.learning.optimizers.Optimizer] = None,
    local_epochs: int = 1,
    learning_rate_decay: float = 1.0,
    momentum: Optional[float] = None,
    num_clients: Optional[int] = None,
) -> process_lib.PersonalizedProcess:
  """Builds SCAFFOLD (option II); see the module docstring.

  Args:
    spec: model spec.
    initial_weights: seeded initial global weights.
    client_optimizer: TFF optimizer for local training (its learning rate is
      the lr of option II).
    server_optimizer: applies the mean delta y; default SGD at 1.0.
    local_epochs: local epochs.
    learning_rate_decay: per-round client learning-rate decay.
    momentum: the client optimizer's momentum rho, for the momentum-adjusted
      step count; default None reads it off the client optimizer; a given
      value must match it.
    num_clients: N, the number of registered clients (from `run_context`).

  Raises:
    ValueError: when `num_clients` is missing or < 1, or `momentum` is out
      of range or differs from the client optimizer's.
  """
  if num_clients is None:
    raise ValueError(
        'SCAFFOLD needs num_clients, the number of registered clients N of '
        'its server step c <- c + (1/N) sum delta c_i: pass '
        'run_context=dict(num_clients=...) to registry.build.')
  if int(num_clients) != num_clients or num_clients < 1:
    raise ValueError(f'SCAFFOLD num_clients must be an integer >= 1, got '
                     f'{num_clients}.')
  momentum = local_steps.check_momentum(client_optimizer, initial_weights,
                                        momentum, 'SCAFFOLD')
  inv_n = 1.0 / float(num_clients)
  if server_optimizer is None:
    server_optimizer = tff.learning.optimizers.build_sgdm(learning_rate=1.0)
  weights_type = spec.weights_type()
  control = server_control.build_server_control(
      server_optimizer, weights_type,
      initial_extra=server_control.zeros_like_trainable(initial_weights),
      update_extra=lambda c, summed: [a + inv_n * b
                                      for a, b in zip(c, summed)])
  extra_type = control.broadcast_extra.type_signature.result
  broadcast_type = process_lib.broadcast_type(weights_type, extra_type)
  state_type = tff.types.tensorflow_to_type(ScaffoldClientState(
      control=extra_type, num_participations=tff.TensorType(np.int32)))
  local_update = client_works.build_local_update(
      spec, client_optimizer, epochs=local_epochs,
      learning_rate_decay=learning_rate_decay,
      extra_loss_fn=correction_factory)

  @tf.function
  def train(model, start, correction, dataset, round_num):
    result = local_update(model, start, dataset, round_num,
                          anchor=correction)
    steps = local_steps.effective_steps(result.num_steps, momentum)
    lr = client_works.round_learning_rate(
        client_optimizer, learning_rate_decay, round_num,
        model.trainable_variables)
    return result, steps, lr

  @tff.tensorflow.computation(broadcast_type, state_type, spec.data_type())
  def update(broadcast, state, dataset):
    model = spec.keras_model_fn()
    start = process_lib._as_model_weights(broadcast.model_weights)  # pylint: disable=protected-access
    c = list(broadcast.extra)
    c_i = list(state.control)
    result, steps, lr = train(model, start, [a - b for a, b in zip(c, c_i)],
                              dataset, broadcast.round_num)
    delta = client_works.model_delta(start, result.weights)
    scale = 1.0 / tf.maximum(steps * lr, 1e-12)
    new_c_i = [ci - cc + d * scale
               for ci, cc, d in zip(c_i, c, delta.trainable)]
    finite = tf.logical_and(result.finite,
                            local_training.all_finite(new_c_i))
    ok = tf.logical_and(finite, steps > 0.0)
    upload = local_training.select(
        ok,
        server_control.MeanAndSum(
            mean=delta, sum=[n - o for n, o in zip(new_c_i, c_i)]),
        server_control.MeanAndSum(
            mean=client_works.zeros_like_weights(start),
            sum=[tf.zeros_like(o) for o in c_i]))
    weight = tf.where(ok, result.metrics['num_examples'], 0.0)
    metrics = result.metrics.copy()
    metrics['non_finite'] = 1.0 - tf.cast(finite, tf.float32)
    new_state = ScaffoldClientState(
        control=local_training.select(ok, new_c_i, c_i),
        num_participations=(state.num_participations +
                            tf.cast(ok, tf.int32)))
    return process_lib.ClientOutput(
        upload, weight, new_state, metrics,
        local_model=local_training.select(ok, result.weights, start))

  zeros = server_control.zeros_like_trainable(initial_weights)

  def initial_state(client_id: str) -> ScaffoldClientState:
    del client_id
    return ScaffoldClientState([np.copy(z) for z in zeros], np.int32(0))

  work = process_lib.ClientWork(update=update, state_type=state_type,
                                initial_state=initial_state)
  return process_lib.compose_with_global_model(
      spec, initial_weights, work,
      aggregator_factory=server_control.MeanAndSumFactory(),
      finalizer=control.finalizer,
      broadcast_extra=control.broadcast_extra, name='scaffold')
