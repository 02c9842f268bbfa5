"""Switch tests for FedProx, FedPer, FedRep and Ditto.

Each method's key term must change the result, and each degenerates to the
method it extends exactly when its switch is off.
"""

import functools

import numpy as np
import pytest
import tensorflow_federated as tff

from tff_pfl.algorithms import ditto
from tff_pfl.algorithms import fedavg
from tff_pfl.algorithms import fedper
from tff_pfl.algorithms import fedprox
from tff_pfl.algorithms import fedrep
from tff_pfl.core import model_spec

from tests.tff_pfl import conftest as helpers

SPEC = helpers.make_spec()
W0 = SPEC.initial_weights(seed=3)
ARRAYS = helpers.make_client_arrays(3)
DATA = [helpers.to_dataset(x, y) for x, y in ARRAYS]


@functools.lru_cache(maxsize=None)
def _process(build, lr, epochs, **kwargs):
  """One process per configuration: tests that run the same one share it
  (a process is stateless; building and first running it is what costs)."""
  return build(SPEC, initial_weights=W0, local_epochs=epochs,
               client_optimizer=tff.learning.optimizers.build_sgdm(lr),
               **kwargs)


def _run(build, rounds=1, lr=0.1, epochs=3, **kwargs):
  process = _process(build, lr, epochs, **kwargs)
  state = process.initialize()
  states = [process.initial_client_state(str(i)) for i in range(3)]
  for _ in range(rounds):
    state, states, _ = process.next(state, states, DATA)
  return process, state, states


def _with_head(global_weights, head):
  """The global body with a client's head, as `ModelWeights`."""
  n = len(head)
  return tff.learning.models.ModelWeights(
      trainable=[np.asarray(w) for w in global_weights.trainable[:-n]]
      + [np.asarray(h) for h in head],
      non_trainable=[np.asarray(w) for w in global_weights.non_trainable])


def _eager_loss_sum(weights, dataset):
  model = SPEC.keras_model_fn()
  model_spec.assign_weights(model, weights)
  return float(sum(
      SPEC.loss(b['y'], model(b['x'])) * len(b['y']) for b in dataset))


def _distance(a, b):
  return float(np.sqrt(sum(np.sum((np.asarray(x) - np.asarray(y))**2)
                           for x, y in zip(a, b))))


def test_fedprox_larger_mu_pulls_towards_global_and_zero_is_fedavg():
  distances = []
  for mu in (0.0, 1.0, 10.0):
    _, state, _ = _run(fedprox.build_fedprox, mu=mu)
    distances.append(_distance(state.global_model_weights.trainable,
                               W0.trainable))
  # With one round, distance(global_1, w0) is the averaged client drift.
  assert distances[0] > distances[1] > distances[2] > 0
  _, avg, _ = _run(fedavg.build_fedavg)
  np.testing.assert_allclose(
      _distance(avg.global_model_weights.trainable, W0.trainable),
      distances[0], rtol=1e-5)
  with pytest.raises(ValueError, match='mu'):
    fedprox.build_fedprox(SPEC, initial_weights=W0, mu=-1.0,
                          client_optimizer=tff.learning.optimizers.build_sgdm(
                              0.1))


def test_fedper_heads_differ_and_global_head_never_moves():
  process, state, states = _run(fedper.build_fedper, rounds=2)
  n = SPEC.num_head_variables()
  assert n == 2
  heads = [s.head for s in states]
  assert not np.allclose(heads[0][0], heads[1][0])
  for got, init in zip(state.global_model_weights.trainable[-n:],
                       W0.trainable[-n:]):
    np.testing.assert_array_equal(got, init)
  # The body is shared and trained.
  assert not np.allclose(state.global_model_weights.trainable[0],
                         W0.trainable[0])
  # The global head is never trained, so only personal models are evaluated,
  # each with its own head.
  stats = process.evaluate(state, states, DATA)
  assert set(stats) == {'personal'}
  assert len(stats['personal']) == 3
  assert not process.has_global_model
  for k in range(3):
    assert stats['personal'][k]['loss_sum'] == pytest.approx(
        _eager_loss_sum(_with_head(state.global_model_weights,
                                   states[k].head), DATA[k]), rel=1e-5)


def test_fedper_and_fedrep_start_a_round_from_the_clients_own_head():
  """Round 2 starts from the global body and the head stored in round 1."""
  for build, kwargs, num_last, epochs in (
      (fedper.build_fedper, {}, None, 3),
      (fedrep.build_fedrep, {'head_epochs': 2}, 2, 2)):
    process, state1, states1 = _run(build, **kwargs)
    _, states2, _ = process.next(state1, list(states1), DATA)
    start = _with_head(state1.global_model_weights, states1[0].head)
    # FedPer trains the whole model 3 epochs; FedRep's head epochs train
    # the head alone and its body epochs then leave it as it is.
    model = helpers.eager_sgd(SPEC, start, DATA[0], epochs=epochs, lr=0.1,
                              num_last=num_last)
    for got, want in zip(states2[0].head, model.trainable_variables[-2:]):
      np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-6)


def test_fedrep_trains_head_then_body_and_differs_from_fedper():
  _, rep, rep_states = _run(fedrep.build_fedrep, head_epochs=2)
  _, per, per_states = _run(fedper.build_fedper)
  assert not np.allclose(rep_states[0].head[0], per_states[0].head[0])
  assert not np.allclose(rep.global_model_weights.trainable[0],
                         per.global_model_weights.trainable[0])
  # The head update uses the *global* body: with a frozen body, training
  # only the head of client 0 from the initial model reproduces it.
  model = helpers.eager_sgd(SPEC, W0, DATA[0], epochs=2, lr=0.1, num_last=2)
  # The body epochs then leave the head alone.
  np.testing.assert_allclose(rep_states[0].head[0],
                             model.trainable_variables[-2].numpy(),
                             rtol=1e-5, atol=1e-6)


def test_ditto_lambda_zero_is_local_training_and_lambda_pulls():
  # Two rounds: the personal model v_k continues from its own last value
  # (6 epochs of local training in all), not from the global model.
  _, _, free = _run(ditto.build_ditto, rounds=2, lambda_=0.0)
  model = helpers.eager_sgd(SPEC, W0, DATA[2], epochs=6, lr=0.1)
  for got, want in zip(free[2].personal_weights.trainable,
                       model.trainable_variables):
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-6)
  # In round 2 the proximal term pulls v_k towards the global model the
  # round received (round 1's), which is no longer W0.
  process, state1, states1 = _run(ditto.build_ditto, lambda_=5.0)
  _, pulled, _ = process.next(state1, list(states1), DATA)
  assert not np.allclose(state1.global_model_weights.trainable[0],
                         W0.trainable[0])
  # The same round 2 with lambda = 0 from the same round-1 states.
  free_process = ditto.build_ditto(
      SPEC, initial_weights=W0, local_epochs=3, lambda_=0.0,
      client_optimizer=tff.learning.optimizers.build_sgdm(0.1))
  _, unpulled, _ = free_process.next(state1, list(states1), DATA)
  anchor = state1.global_model_weights.trainable
  for k in range(3):
    assert (_distance(pulled[k].personal_weights.trainable, anchor)
            < _distance(unpulled[k].personal_weights.trainable, anchor))


def test_fedper_and_fedrep_local_statistics_keep_batch_norm_on_the_client():
  """`local_statistics=True`: from its second round on a client trains and
  is evaluated with its own BatchNorm statistics, whatever the global ones;
  by default it takes the global (averaged) ones."""
  spec = helpers.make_spec(batch_norm=True)
  w0 = spec.initial_weights(seed=0)
  data = [helpers.to_dataset(x, y) for x, y in helpers.make_client_arrays(2)]

  def two_rounds(build, local_statistics):
    process = build(spec, initial_weights=w0, local_statistics=local_statistics,
                    client_optimizer=tff.learning.optimizers.build_sgdm(0.1))
    state, other, states = helpers.round_then_shift_statistics(process, data)
    _, a, _ = process.next(state, list(states), data)
    _, b, _ = process.next(other, list(states), data)
    evaluations = [
        [r['loss_sum'] for r in process.evaluate(s, states, data)['personal']]
        for s in (state, other)]
    return process, state, states, a, b, evaluations

  # FedPer and FedRep share the client work (`templates.personal_head`).
  for build in (fedper.build_fedper,):
    process, state, states, a, b, evaluations = two_rounds(build, True)
    np.testing.assert_allclose(evaluations[0], evaluations[1], rtol=1e-6)
    for x, y in zip(a, b):
      for u, v in zip(x.head + x.statistics, y.head + y.statistics):
        np.testing.assert_allclose(u, v, rtol=1e-6, atol=1e-7)
    # Round 1's statistics are the client's own (trained from the initial
    # ones), and differ between clients.
    assert not np.allclose(states[0].statistics[0], states[1].statistics[0])
    assert not np.allclose(states[0].statistics[0], w0.non_trainable[0])
    # Evaluated with global body + own head + own statistics.
    stats = process.evaluate(state, states, data)
    for k in range(2):
      weights = tff.learning.models.ModelWeights(
          trainable=_with_head(state.global_model_weights,
                               states[k].head).trainable,
          non_trainable=list(states[k].statistics))
      model = spec.keras_model_fn()
      model_spec.assign_weights(model, weights)
      want = float(sum(spec.loss(d['y'], model(d['x'])) * len(d['y'])
                       for d in data[k]))
      assert stats['personal'][k]['loss_sum'] == pytest.approx(want, rel=1e-5)
    # The default evaluates (and starts training) with the global
    # statistics: the +3 shift changes every client's evaluation.
    *_, evaluations = two_rounds(build, False)
    for x, y in zip(*evaluations):
      assert x != pytest.approx(y, rel=1e-3)

  rep = fedrep.build_fedrep(spec, initial_weights=w0, local_statistics=True,
                            client_optimizer=tff.learning.optimizers.build_sgdm(
                                0.1))
  assert len(rep.initial_client_state('0').statistics) == len(
      w0.non_trainable)
  with pytest.raises(ValueError, match='no non-trainable weights'):
    fedper.build_fedper(SPEC, initial_weights=W0, local_statistics=True,
                        client_optimizer=tff.learning.optimizers.build_sgdm(
                            0.1))
