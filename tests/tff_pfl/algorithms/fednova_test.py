"""FedNova: FedAvg with equal local steps, normalized averaging otherwise."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_pfl.algorithms import fedavg
from tff_pfl.algorithms import fednova
from tff_pfl.templates import local_steps

from tests.tff_pfl import conftest as helpers

SPEC = helpers.make_spec()
W0 = SPEC.initial_weights(seed=3)
LR, EPOCHS, BATCH = 0.1, 2, 8
EQUAL = helpers.make_client_arrays(3)                      # 3 batches each
UNEQUAL = [(x[:n], y[:n]) for (x, y), n in zip(EQUAL, (24, 16, 8))]


def _data(arrays):
  return [helpers.to_dataset(x, y, BATCH) for x, y in arrays]


@pytest.fixture(scope='module')
def processes():
  kwargs = dict(initial_weights=W0, local_epochs=EPOCHS,
                client_optimizer=tff.learning.optimizers.build_sgdm(LR))
  return dict(fednova=fednova.build_fednova(SPEC, **kwargs),
              fedavg=fedavg.build_fedavg(SPEC, **kwargs))


def _one_round(process, arrays):
  state = process.initialize()
  states = [process.initial_client_state(str(i)) for i in range(3)]
  state, _, _ = process.next(state, states, _data(arrays))
  return [np.asarray(w) for w in state.global_model_weights.trainable]


def test_equal_local_steps_is_fedavg(processes):
  nova = _one_round(processes['fednova'], EQUAL)
  avg = _one_round(processes['fedavg'], EQUAL)
  for a, b in zip(nova, avg):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_unequal_local_steps_normalizes_the_updates(processes):
  nova = _one_round(processes['fednova'], UNEQUAL)
  avg = _one_round(processes['fedavg'], UNEQUAL)
  assert sum(np.abs(a - b).sum() for a, b in zip(nova, avg)) > 1e-4
  # NumPy reference: d_i = (x - y_i) / a_i, a_i = tau_i (plain SGD),
  # x <- x - tau_eff sum_i p_i d_i with p_i = n_i / n.
  sizes = np.array([len(y) for _, y in UNEQUAL], np.float64)
  p = sizes / sizes.sum()
  taus = EPOCHS * np.ceil(sizes / BATCH)
  tau_eff = float(np.dot(p, taus))
  d = []
  for x, y in UNEQUAL:
    model = helpers.eager_sgd(SPEC, W0, helpers.to_dataset(x, y, BATCH),
                              epochs=EPOCHS, lr=LR)
    d.append([(w0 - v.numpy()) / (EPOCHS * np.ceil(len(y) / BATCH))
              for w0, v in zip(W0.trainable, model.trainable_variables)])
  for k, got in enumerate(nova):
    update = sum(p_i * d_i[k] for p_i, d_i in zip(p, d))
    np.testing.assert_allclose(got, W0.trainable[k] - tau_eff * update,
                               rtol=1e-4, atol=1e-5)


def test_momentum_adjusted_steps_match_heavy_ball_sgd():
  lr, grad = 0.1, 1.0
  for rho in (0.0, 0.5, 0.9):
    for tau in (1, 3, 10):
      w, m = 0.0, 0.0
      for _ in range(tau):           # TFF build_sgdm: m <- rho m + g
        m = rho * m + grad
        w -= lr * m
      a = float(local_steps.effective_steps(tf.constant(float(tau)), rho))
      np.testing.assert_allclose(a, -w / (lr * grad), rtol=1e-5)
  assert local_steps.effective_steps(4.0, 0.0) == 4.0


def test_momentum_is_read_off_the_optimizer_or_must_match_it():
  momentum_sgd = tff.learning.optimizers.build_sgdm(0.1, momentum=0.9)
  assert local_steps.check_momentum(momentum_sgd, W0, None, 'x') == (
      pytest.approx(0.9))
  assert local_steps.check_momentum(
      tff.learning.optimizers.build_sgdm(0.1), W0, None, 'x') == 0.0
  with pytest.raises(ValueError, match='momentum'):
    fednova.build_fednova(SPEC, initial_weights=W0, momentum=0.0,
                          client_optimizer=momentum_sgd)
  with pytest.raises(ValueError, match='momentum'):
    fednova.build_fednova(
        SPEC, initial_weights=W0, momentum=1.0,
        client_optimizer=tff.learning.optimizers.build_sgdm(0.1))
