"""SCAFFOLD: first round is FedAvg, control variates follow option II."""

import numpy as np
import pytest
import tensorflow_federated as tff

from tff_pfl.algorithms import fedavg
from tff_pfl.algorithms import registry
from tff_pfl.algorithms import scaffold

from tests.tff_pfl import conftest as helpers

SPEC = helpers.make_spec()
W0 = SPEC.initial_weights(seed=3)
ARRAYS = helpers.make_client_arrays(3)
DATA = [helpers.to_dataset(x, y) for x, y in ARRAYS]   # 3 batches of 8
LR, EPOCHS, NUM_CLIENTS = 0.1, 2, 4
STEPS = 3 * EPOCHS


def _sgd():
  return tff.learning.optimizers.build_sgdm(LR)


def _rounds(process, rounds=2):
  state = process.initialize()
  states = [process.initial_client_state(str(i)) for i in range(3)]
  history = []
  for _ in range(rounds):
    state, states, _ = process.next(state, states, DATA)
    history.append((state, states))
  return history


@pytest.fixture(scope='module')
def runs():
  kwargs = dict(initial_weights=W0, client_optimizer=_sgd(),
                local_epochs=EPOCHS)
  return dict(
      scaffold=_rounds(scaffold.build_scaffold(
          SPEC, num_clients=NUM_CLIENTS, **kwargs)),
      fedavg=_rounds(fedavg.build_fedavg(SPEC, **kwargs)))


def _assert_weights_close(a, b):
  for x, y in zip(a.trainable, b.trainable):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


def test_first_round_with_zero_controls_is_fedavg(runs):
  (s1, _), _ = runs['scaffold']
  (a1, _), _ = runs['fedavg']
  _assert_weights_close(s1.global_model_weights, a1.global_model_weights)


def test_option_two_controls_and_server_control_after_round_one(runs):
  (s1, states1), _ = runs['scaffold']
  controls = [np.array(c) for c in s1.finalizer.extra]
  assert all(np.isfinite(c).all() for c in controls)
  assert sum(np.abs(c).sum() for c in controls) > 0
  for i, (x, y) in enumerate(ARRAYS):
    # c_i+ = c_i - c + (x - y_i) / (K lr) with c = c_i = 0, y_i from plain
    # SGD (the correction is zero in round 1).
    model = helpers.eager_sgd(SPEC, W0, helpers.to_dataset(x, y),
                              epochs=EPOCHS, lr=LR)
    for got, w0, y_i in zip(states1[i].control, W0.trainable,
                            model.trainable_variables):
      np.testing.assert_allclose(got, (w0 - y_i.numpy()) / (STEPS * LR),
                                 rtol=1e-4, atol=1e-5)
    assert states1[i].num_participations == 1
  # c = (1/N) sum_i delta c_i, and delta c_i = c_i+ in round 1.
  for k, c in enumerate(controls):
    want = sum(np.asarray(s.control[k]) for s in states1) / NUM_CLIENTS
    np.testing.assert_allclose(c, want, rtol=1e-5, atol=1e-7)


def test_round_two_is_corrected_and_controls_accumulate(runs):
  (s1, states1), (s2, states2) = runs['scaffold']
  _, (a2, _) = runs['fedavg']
  distance = sum(np.abs(np.asarray(x) - np.asarray(y)).sum() for x, y in zip(
      s2.global_model_weights.trainable, a2.global_model_weights.trainable))
  assert distance > 1e-3
  for k, c in enumerate(s2.finalizer.extra):
    delta = sum(np.asarray(n.control[k]) - np.asarray(o.control[k])
                for n, o in zip(states2, states1))
    np.testing.assert_allclose(
        c, np.asarray(s1.finalizer.extra[k]) + delta / NUM_CLIENTS,
        rtol=1e-4, atol=1e-6)


def test_scaffold_needs_num_clients_and_matching_momentum():
  with pytest.raises(ValueError, match='num_clients'):
    scaffold.build_scaffold(SPEC, initial_weights=W0, client_optimizer=_sgd())
  with pytest.raises(ValueError, match='num_clients'):
    registry.build('scaffold', SPEC, initial_weights=W0,
                   client_optimizer=_sgd())
  with pytest.raises(ValueError, match='num_clients'):
    scaffold.build_scaffold(SPEC, initial_weights=W0, client_optimizer=_sgd(),
                            num_clients=0)
  with pytest.raises(ValueError, match='momentum'):
    scaffold.build_scaffold(
        SPEC, initial_weights=W0, num_clients=4, momentum=0.0,
        client_optimizer=tff.learning.optimizers.build_sgdm(0.1,
                                                            momentum=0.9))
