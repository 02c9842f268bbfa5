"""FedCurv: Fisher bookkeeping, lambda = 0 is FedAvg, the penalty pulls."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_pfl.algorithms import fedcurv
from tff_pfl.core import model_spec

from tests.tff_pfl import conftest as helpers

SPEC = helpers.make_spec()
W0 = SPEC.initial_weights(seed=3)
ARRAYS = helpers.make_client_arrays(3)
DATA = [helpers.to_dataset(x, y) for x, y in ARRAYS]   # 3 batches of 8
LR, EPOCHS, LAMBDA = 0.1, 2, 10.0
# Round 1: every client; round 2: clients 0 and 1 (client 2's round-1
# contribution stays in the server sums with 'latest'); round 3: clients 1
# (also in round 2) and 2 (not in round 2).
COHORTS = ([0, 1, 2], [0, 1], [1, 2])


def _run(process):
  state = process.initialize()
  stored = {i: process.initial_client_state(str(i)) for i in range(3)}
  history = []
  for cohort in COHORTS:
    state, states, _ = process.next(state, [stored[i] for i in cohort],
                                    [DATA[i] for i in cohort])
    stored.update(zip(cohort, states))
    history.append((state, dict(stored)))
  return history


@pytest.fixture(scope='module')
def runs():
  kwargs = dict(initial_weights=W0, local_epochs=EPOCHS,
                client_optimizer=tff.learning.optimizers.build_sgdm(LR))
  return dict(
      free=_run(fedcurv.build_fedcurv(SPEC, lambda_=0.0, **kwargs)),
      curv=_run(fedcurv.build_fedcurv(SPEC, lambda_=LAMBDA, **kwargs)),
      previous=_run(fedcurv.build_fedcurv(
          SPEC, lambda_=LAMBDA, fisher_window='previous_round', **kwargs)))


def _eager_fedavg():
  """FedAvg over COHORTS written out eagerly: equal-sized clients, so each
  round's global model is the plain mean of the cohort's SGD results."""
  weights, history = W0, []
  for cohort in COHORTS:
    weights = helpers.eager_fedavg_round(
        SPEC, weights, [DATA[i] for i in cohort], epochs=EPOCHS, lr=LR)
    history.append(weights.trainable)
  return history


def _weights(state):
  return [np.asarray(w) for w in state.global_model_weights.trainable]


def _close(a, b):
  return all(np.allclose(x, y, rtol=1e-5, atol=1e-6) for x, y in zip(a, b))


def test_lambda_zero_is_fedavg_and_lambda_acts_from_round_two(runs):
  reference = _eager_fedavg()
  for r in range(2):
    assert _close(_weights(runs['free'][r][0]), reference[r])
  # Round 1 has no Fisher information yet: the penalty is zero.
  assert _close(_weights(runs['curv'][0][0]), reference[0])
  assert not _close(_weights(runs['curv'][1][0]), reference[1])


def _reference_fisher(weights, dataset):
  model = SPEC.keras_model_fn()
  model_spec.assign_weights(model, tff.learning.models.ModelWeights(
      trainable=list(weights), non_trainable=[]))
  squares = [np.zeros(w.shape) for w in weights]
  batches = 0
  for batch in dataset:
    with tf.GradientTape() as tape:
      loss = SPEC.loss(batch['y'], model(batch['x'], training=False))
    for s, g in zip(squares, tape.gradient(loss, model.trainable_variables)):
      s += g.numpy() ** 2
    batches += 1
  return [s / batches for s in squares]


def test_fisher_is_the_mean_squared_batch_gradient(runs):
  _, stored = runs['free'][0]
  for i, dataset in enumerate(DATA):
    fisher = [np.asarray(f) for f in stored[i].fisher]
    assert all(np.isfinite(f).all() and (f >= 0).all() for f in fisher)
    assert sum(f.sum() for f in fisher) > 0
    want = _reference_fisher([np.asarray(w) for w in stored[i].weights],
                             dataset)
    for got, ref in zip(fisher, want):
      np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-8)


def test_fisher_samples_limits_the_batches():
  model = SPEC.keras_model_fn()
  model_spec.assign_weights(model, W0)
  # Batches of 8 are used while at most 8 examples were seen: two batches.
  got = fedcurv.fisher_diagonal(SPEC, model, DATA[0], 8)
  want = _reference_fisher(W0.trainable, DATA[0].take(2))
  for g, w in zip(got, want):
    np.testing.assert_allclose(g.numpy(), w, rtol=1e-4, atol=1e-8)


def _assert_sums_are(sums, contributions):
  for k in range(len(W0.trainable)):
    fisher = [np.asarray(c.fisher[k]) for c in contributions]
    weights = [np.asarray(c.weights[k]) for c in contributions]
    np.testing.assert_allclose(sums.fisher[k], sum(fisher),
                               rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(
        sums.fisher_weights[k],
        sum(f * w for f, w in zip(fisher, weights)), rtol=1e-4, atol=1e-7)


def test_server_sums_are_the_stored_contributions(runs):
  # 'latest': every client's latest contribution, sampled or not.
  for state, stored in runs['curv']:
    _assert_sums_are(state.finalizer.extra, stored.values())
  # 'previous_round': only this round's cohort's.
  for (state, stored), cohort in zip(runs['previous'], COHORTS):
    _assert_sums_are(state.finalizer.extra, [stored[i] for i in cohort])
    for i in cohort:
      assert int(stored[i].contributed_round) == COHORTS.index(cohort)


def _eager_fedcurv_client(start, dataset, terms):
  """Client training written out eagerly: SGD on the batch cross-entropy
  plus lambda sum_p (U_i v^2 - 2 V_i v), with (U_i, V_i) = `terms`."""
  model = SPEC.keras_model_fn()
  model_spec.assign_weights(model, tff.learning.models.ModelWeights(
      trainable=list(start), non_trainable=[]))
  variables = model.trainable_variables
  for _ in range(EPOCHS):
    for batch in dataset:
      with tf.GradientTape() as tape:
        loss = SPEC.loss(batch['y'], model(batch['x'], training=True))
        loss += LAMBDA * tf.add_n([
            tf.reduce_sum(u * tf.square(v) - 2.0 * q * v)
            for v, u, q in zip(variables, *terms)])
      for v, g in zip(variables, tape.gradient(loss, variables)):
        v.assign_sub(LR * g)
  return [v.numpy() for v in variables]


@pytest.mark.parametrize('window', ['curv', 'previous'])
def test_the_penalty_leaves_out_exactly_the_clients_own_term(runs, window):
  """Round 3 of COHORTS, each client re-trained eagerly against the server
  sums it received minus its own term: with 'latest' always its stored
  one; with 'previous_round' only client 1's (in round 2's cohort), while
  client 2's round-1 term is not in the sums and is not subtracted."""
  state, before = runs[window][1]
  _, after = runs[window][2]
  sums = state.finalizer.extra
  start = _weights(state)
  for i in COHORTS[2]:
    own_counts = window == 'curv' or i in COHORTS[1]
    f = [np.asarray(t) * own_counts for t in before[i].fisher]
    fw = [t * np.asarray(w) for t, w in zip(f, before[i].weights)]
    terms = ([np.maximum(np.asarray(u) - a, 0.0)
              for u, a in zip(sums.fisher, f)],
             [np.asarray(v) - a for v, a in zip(sums.fisher_weights, fw)])
    want = _eager_fedcurv_client(start, DATA[i], terms)
    got = [np.asarray(w) for w in after[i].weights]
    assert _close(got, want), (window, i)


def _penalty_distance(i, trained, contributions):
  """sum_{j != i} sum_p F_j (theta_i - theta_j)^2."""
  total = 0.0
  for j, c in contributions.items():
    if j != i:
      total += sum(float(np.sum(np.asarray(f) * (np.asarray(t) -
                                                 np.asarray(w)) ** 2))
                   for f, t, w in zip(c.fisher, trained, c.weights))
  return total


def test_lambda_keeps_clients_close_where_others_fisher_is_large(runs):
  _, round1 = runs['free'][0]
  for i in COHORTS[1]:
    free = _penalty_distance(i, runs['free'][1][1][i].weights, round1)
    pulled = _penalty_distance(i, runs['curv'][1][1][i].weights, round1)
    assert pulled < 0.9 * free


def test_invalid_hparams():
  sgd = tff.learning.optimizers.build_sgdm(0.1)
  with pytest.raises(ValueError, match='lambda_'):
    fedcurv.build_fedcurv(SPEC, initial_weights=W0, client_optimizer=sgd,
                          lambda_=-1.0)
  with pytest.raises(ValueError, match='fisher_samples'):
    fedcurv.build_fedcurv(SPEC, initial_weights=W0, client_optimizer=sgd,
                          fisher_samples=0)
  with pytest.raises(ValueError, match="fisher_window.*'previous'"):
    fedcurv.build_fedcurv(SPEC, initial_weights=W0, client_optimizer=sgd,
                          fisher_window='previous')
