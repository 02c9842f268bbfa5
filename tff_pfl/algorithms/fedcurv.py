"""FedCurv (Shoham et al., 2019, "Overcoming Forgetting in Federated Learning
on Non-IID Data").

Client i minimises its task loss plus an EWC-style penalty that keeps the
parameters important to the other clients close to their values there
(Shoham et al., arXiv:1910.07796, the FedCurv local loss):

    L_i(theta) = CE_i(theta)
                 + lambda sum_{j != i} sum_p F_j,p (theta_p - theta_j,p)^2,

with F_j the diagonal Fisher information of client j at its trained weights
theta_j. Expanding the square, the penalty is (up to a constant)

    lambda sum_p (U_i,p theta_p^2 - 2 V_i,p theta_p),
    U_i = U - F_i,  V_i = V - F_i * theta_i,
    U = sum_j F_j,  V = sum_j F_j * theta_j,

so the server only needs to keep and broadcast the two sums.

Bookkeeping (what we do exactly), chosen by `fisher_window`:
* 'latest' (default): U and V are the sums of the LATEST contribution
  (F_j, F_j * theta_j) of every client that has ever taken part (as in the
  FedNTD code base, which keeps each client's latest upload in a
  dictionary). Each client keeps its own latest contribution in its client
  state (`fisher` = F_i and `weights` = theta_i, zeros before its first
  round) and uploads the CHANGE of its contribution,
  (F_i' - F_i, F_i' theta_i' - F_i theta_i), which the server sums over the
  sampled clients and adds to (U, V) (`server_control`). So U and V always
  equal the sums over the stored client states, and U - F_i,
  V - F_i theta_i remove exactly client i's own term, which is part of U
  and V whenever it has contributed.
* 'previous_round': Shoham et al.'s rule, where every node's penalty uses
  the terms the other nodes sent in the PREVIOUS round (their Eq. for
  L~_s at round t sums over theta^_{t-1,j} and I^_{t-1,j}). With client
  sampling, that is the previous round's cohort: clients upload
  (F_i', F_i' theta_i') and the server REPLACES (U, V) with the round's
  sums. Client i subtracts its own stored term only if it contributed in
  the previous round (`contributed_round` = t - 1); otherwise its term is
  not in U and V. With 10% of clients sampled, this penalty sums about
  one tenth of the terms that 'latest' sums. (If a round's summed upload
  is non-finite although every client's was finite, i.e. it overflowed,
  the server keeps the previous sums, `server_control`, and for one round
  that cohort subtracts terms that are not in them; with 'latest' such a
  round's changes are lost for good. Neither has been seen.)
* The penalty uses the sums at the start of the round: in round 1 they are
  zero, so round 1 is FedAvg. U - F_i is clipped at 0 against rounding.
  (FedNTD's server subtracts each client's term from the round's sums in
  place, so later clients of a round also lose the earlier clients' terms;
  we do not reproduce that.)
* F_i is the diagonal empirical Fisher computed after local training at
  theta_i: the mean over mini-batches of the squared gradient of the batch
  cross-entropy (the negative log-likelihood), using the first batches of
  the client's data until more than `fisher_samples` examples are seen (the
  FedNTD implementation's estimator and its `size` = 500), with the model
  in inference mode (BatchNorm uses its moving statistics). theta_i are the
  trainable weights; BatchNorm statistics are averaged as in FedAvg.
* The model part of the upload is FedAvg's: the example-weighted mean of
  the pseudo-gradients, applied with the server optimizer.
* The client state store and the server sums must be checkpointed and
  restored together (the run loop does), or U, V and the clients' stored
  contributions disagree.

Default lambda = 1.0 and fisher_samples = 500: the FedNTD code base
(Lee et al., NeurIPS 2022, github.com/Lee-Gihun/FedNTD,
config/fedcurv.json: "params": {"size": 500, "lam": 1.0}), whose training
setup (100 clients, 10% sampled, 5 local epochs, batch 50, SGD lr 0.01,
momentum 0.9, weight decay 1e-5, decay 0.99, 200 rounds) the FedPSD paper's
Section V-C repeats. lambda = 0 is FedAvg (tested). A client with
non-finite training or Fisher uploads zeros with weight 0 and keeps its
stored contribution. FedCurv has no personalized model: clients are
evaluated with the global model.
"""

from typing import Any, NamedTuple, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_pfl.core import model_spec as model_spec_lib
from tff_pfl.core import process as process_lib
from tff_pfl.templates import client_works
from tff_pfl.templates import local_training
from tff_pfl.templates import server_control


FISHER_WINDOWS = ('latest', 'previous_round')


class FisherSums(NamedTuple):
  """Fisher terms, one tensor per trainable weight.

  On the server: U = sum_j F_j and V = sum_j F_j * theta_j; in an upload,
  their changes; as a penalty, U_i and V_i.
  """
  fisher: Any
  fisher_weights: Any


class FedCurvClientState(NamedTuple):
  """Client i's latest contribution to the server sums.

  Attributes:
    fisher: F_i (zeros before the client's first round).
    weights: theta_i, its trainable weights after that round's training.
    num_participations: rounds taken part in whose training finished (a
      diverged one is not counted).
    contributed_round: the 0-based round of that contribution (-1 before
      the first); `fisher_window='previous_round'` reads it.
  """
  fisher: Any
  weights: Any
  num_participations: Any
  contributed_round: Any


def penalty_factory(lambda_: float):
  """`FisherSums(U_i, V_i) -> ExtraLossFn` of lambda sum(U_i v^2 - 2 V_i v).

  Used as `build_local_update`'s `extra_loss_fn`; the call's `anchor`
  carries the client's `FisherSums(U_i, V_i)`.
  """
  def factory(terms: FisherSums) -> local_training.ExtraLossFn:
    def extra_loss(model, batch, outputs):
      del batch, outputs
      return lambda_ * tf.add_n([
          tf.reduce_sum(u * tf.square(v) - 2.0 * q * v)
          for v, u, q in zip(model.trainable_variables, terms.fisher,
                             terms.fisher_weights)])
    return extra_loss
  return factory


def fisher_diagonal(spec: model_spec_lib.ModelSpec, model: tf.keras.Model,
                    dataset: tf.data.Dataset,
                    max_samples: Optional[int]) -> list[tf.Tensor]:
  """Mean over mini-batches of the squared batch-loss gradient.

  Uses batches while at most `max_samples` examples have been seen before
  them (all batches if None); zeros for an empty dataset.
  """
  variables = model.trainable_variables
  limit = tf.constant(np.inf if max_samples is None else float(max_samples),
                      tf.float32)

  def step(state, batch):
    sums, num_batches, seen = state

    def add():
      with tf.GradientTape() as tape:
        loss = spec.loss(batch['y'], model(batch['x'], training=False))
      grads = tape.gradient(loss, variables)
      return (tuple(s if g is None else s + tf.square(g)
                    for s, g in zip(sums, grads)), num_batches + 1.0)

    sums, num_batches = tf.cond(seen <= limit, add,
                                lambda: (sums, num_batches))
    n = tf.cast(tf.shape(batch['y'])[0], tf.float32)
    return sums, num_batches, seen + n

  # A tuple: tf.data would turn a list into one tensor.
  zeros = tuple(tf.zeros_like(v) for v in variables)
  sums, num_batches, _ = dataset.reduce(
      (zeros, tf.constant(0.0), tf.constant(0.0)), step)
  return [s / tf.maximum(num_batches, 1.0) for s in sums]


def build_fedcurv(
    spec: model_spec_lib.ModelSpec,
    *,
    initial_weights: tff.learning.models.ModelWeights,
    client_optimizer: tff.learning.optimizers.Optimizer,
    server_optimizer: Optional[tff.learning.optimizers.Optimizer] = None,
    local_epochs: int = 1,
    learning_rate_decay: float = 1.0,
    lambda_: float = 1.0,
    fisher_samples: Optional[int] = 500,
    fisher_window: str = 'latest',
) -> process_lib.PersonalizedProcess:
  """Builds FedCurv; see the module docstring.

  Args:
    spec: model spec.
    initial_weights: seeded initial global weights.
    client_optimizer: TFF optimizer for local training.
    server_optimizer: applies the mean delta; default SGD at 1.0.
    local_epochs: local epochs.
    learning_rate_decay: per-round client learning-rate decay.
    lambda_: penalty strength lambda, >= 0 (0 is FedAvg).
    fisher_samples: examples used for the Fisher estimate (>= 1), or None
      for the whole client dataset.
    fisher_window: whose Fisher terms the penalty sums: 'latest' (every
      client's latest, FedNTD code) or 'previous_round' (the previous
      round's cohort, Shoham et al.); see the module docstring.
  """
  if not lambda_ >= 0:
    raise ValueError(f'FedCurv lambda_ must be >= 0, got {lambda_}.')
  if fisher_samples is not None and fisher_samples < 1:
    raise ValueError('FedCurv fisher_samples must be >= 1 or None, got '
                     f'{fisher_samples}.')
  if fisher_window not in FISHER_WINDOWS:
    raise ValueError(f'FedCurv fisher_window must be one of {FISHER_WINDOWS}, '
                     f'got {fisher_window!r}.')
  previous_round = fisher_window == 'previous_round'
  lambda_ = float(lambda_)
  if server_optimizer is None:
    server_optimizer = tff.learning.optimizers.build_sgdm(learning_rate=1.0)
  weights_type = spec.weights_type()
  zeros = server_control.zeros_like_trainable(initial_weights)
  control = server_control.build_server_control(
      server_optimizer, weights_type,
      initial_extra=FisherSums(fisher=zeros, fisher_weights=zeros),
      # 'previous_round' uploads whole terms and keeps only this round's;
      # 'latest' uploads changes of the stored terms and adds them.
      update_extra=((lambda sums, summed: summed) if previous_round else
                    lambda sums, change: tf.nest.map_structure(
                        tf.add, sums, change)))
  extra_type = control.broadcast_extra.type_signature.result
  broadcast_type = process_lib.broadcast_type(weights_type, extra_type)
  trainable_type = extra_type.fisher
  state_type = tff.types.tensorflow_to_type(FedCurvClientState(
      fisher=trainable_type, weights=trainable_type,
      num_participations=tff.TensorType(np.int32),
      contributed_round=tff.TensorType(np.int32)))
  local_update = client_works.build_local_update(
      spec, client_optimizer, epochs=local_epochs,
      learning_rate_decay=learning_rate_decay,
      extra_loss_fn=penalty_factory(lambda_) if lambda_ > 0 else None)

  @tf.function
  def train(model, start, terms, dataset, round_num):
    result = local_update(model, start, dataset, round_num, anchor=terms)
    fisher = fisher_diagonal(spec, model, dataset, fisher_samples)
    return result, fisher

  @tff.tensorflow.computation(broadcast_type, state_type, spec.data_type())
  def update(broadcast, state, dataset):
    model = spec.keras_model_fn()
    start = process_lib._as_model_weights(broadcast.model_weights)  # pylint: disable=protected-access
    old_f, old_w = list(state.fisher), list(state.weights)
    old_fw = [f * w for f, w in zip(old_f, old_w)]
    # Client i's own term in (U, V): its stored one ('latest'; zeros
    # before its first round), or with 'previous_round' only if it
    # contributed in the previous round.
    own = FisherSums(old_f, old_fw)
    if previous_round:
      in_sums = tf.logical_and(
          state.num_participations > 0,
          tf.equal(state.contributed_round, broadcast.round_num - 1))
      own = local_training.select(
          in_sums, own, tf.nest.map_structure(tf.zeros_like, own))
    terms = FisherSums(
        fisher=[tf.maximum(u - f, 0.0)
                for u, f in zip(broadcast.extra.fisher, own.fisher)],
        fisher_weights=[v - fw for v, fw in
                        zip(broadcast.extra.fisher_weights,
                            own.fisher_weights)])
    result, new_f = train(model, start, terms, dataset, broadcast.round_num)
    new_w = list(result.weights.trainable)
    ok = tf.logical_and(result.finite, local_training.all_finite(new_f))
    new_fw = [n * w for n, w in zip(new_f, new_w)]
    if previous_round:
      change = FisherSums(fisher=new_f, fisher_weights=new_fw)
    else:
      change = FisherSums(
          fisher=[n - o for n, o in zip(new_f, old_f)],
          fisher_weights=[n - o for n, o in zip(new_fw, old_fw)])
    upload = local_training.select(
        ok,
        server_control.MeanAndSum(
            mean=client_works.model_delta(start, result.weights),
            sum=change),
        server_control.MeanAndSum(
            mean=client_works.zeros_like_weights(start),
            sum=tf.nest.map_structure(tf.zeros_like, change)))
    weight = tf.where(ok, result.metrics['num_examples'], 0.0)
    metrics = result.metrics.copy()
    metrics['non_finite'] = 1.0 - tf.cast(ok, tf.float32)
    new_state = FedCurvClientState(
        fisher=local_training.select(ok, new_f, old_f),
        weights=local_training.select(ok, new_w, old_w),
        num_participations=(state.num_participations +
                            tf.cast(ok, tf.int32)),
        contributed_round=tf.where(ok, broadcast.round_num,
                                   state.contributed_round))
    return process_lib.ClientOutput(
        upload, weight, new_state, metrics,
        local_model=local_training.select(ok, result.weights, start))

  def initial_state(client_id: str) -> FedCurvClientState:
    del client_id
    return FedCurvClientState([np.copy(z) for z in zeros],
                              [np.copy(z) for z in zeros], np.int32(0),
                              np.int32(-1))

  work = process_lib.ClientWork(update=update, state_type=state_type,
                                initial_state=initial_state)
  return process_lib.compose_with_global_model(
      spec, initial_weights, work,
      aggregator_factory=server_control.MeanAndSumFactory(),
      finalizer=control.finalizer,
      broadcast_extra=control.broadcast_extra, name='fedcurv')
