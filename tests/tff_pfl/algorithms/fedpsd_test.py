"""FedPSD: each switch changes training, all off is FedAvg, state is kept."""

import collections
import functools

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_pfl.algorithms import fedavg
from tff_pfl.algorithms import fedpsd
from tff_pfl.algorithms import registry
from tff_pfl.core import model_spec
from tff_pfl.data import client_data

from tests.tff_pfl import conftest as helpers

BASE = helpers.make_spec()
SPEC = model_spec.ModelSpec(
    BASE.keras_model_fn,
    collections.OrderedDict(BASE.input_spec,
                            index=tf.TensorSpec([None], tf.int64)),
    'classification', helpers.NUM_CLASSES)
W0 = SPEC.initial_weights(seed=5)
ARRAYS = helpers.make_client_arrays(3, n=20)


def _dataset(x, y):
  base = tf.data.Dataset.from_tensor_slices(
      collections.OrderedDict(x=x, y=y))
  return client_data.with_index(base).batch(8)


DATA = [_dataset(x, y) for x, y in ARRAYS]
LR = 0.1


def _build(build_fn=fedpsd.build_fedpsd, **kwargs):
  if build_fn is fedpsd.build_fedpsd:
    kwargs.setdefault('total_rounds', 4)
  return build_fn(SPEC, initial_weights=W0, local_epochs=3,
                  client_optimizer=tff.learning.optimizers.build_sgdm(LR),
                  **kwargs)


def _run(process, rounds=2, states=None):
  state = process.initialize()
  if states is None:
    states = [process.initial_client_state(str(i)) for i in range(3)]
  metrics = []
  for _ in range(rounds):
    state, states, m = process.next(state, states, DATA)
    metrics.append(m['client_work'])
  return state, states, metrics


def _flat(weights):
  return np.concatenate([np.ravel(w) for w in weights.trainable])


@pytest.fixture(scope='module')
def full_run():
  process = _build()
  return process, _run(process)


@functools.lru_cache(maxsize=None)
def _switch_run(rhpk, psd, cll):
  """One round of FedPSD with the given switches (cached: built once)."""
  return _run(_build(rhpk=rhpk, psd=psd, cll=cll), rounds=1)


def test_all_switches_off_is_fedavg():
  off = _switch_run(rhpk=False, psd=False, cll=False)[0]
  avg = _run(_build(fedavg.build_fedavg), rounds=1)[0]
  np.testing.assert_allclose(_flat(off.global_model_weights),
                             _flat(avg.global_model_weights), atol=1e-5)


@pytest.mark.parametrize('switch', ['rhpk', 'psd', 'cll'])
def test_each_switch_changes_training(switch):
  flags = dict(rhpk=False, psd=False, cll=False)
  off_state, _, off_metrics = _switch_run(**flags)
  flags[switch] = True
  on_state, _, on_metrics = _switch_run(**flags)
  diff = np.abs(_flat(on_state.global_model_weights)
                - _flat(off_state.global_model_weights)).max()
  assert diff > 1e-4
  if switch in ('rhpk', 'psd'):
    assert on_metrics[0]['kd_loss_sum'] > 0
    assert off_metrics[0]['kd_loss_sum'] == 0
  else:
    assert on_metrics[0]['loss_sum'] != pytest.approx(
        off_metrics[0]['loss_sum'], rel=1e-4)


def test_predictions_are_stored_and_recalled(full_run):
  process, (_, states, _) = full_run
  for (x, _), state in zip(ARRAYS, states):
    preds = np.asarray(state.predictions)
    assert preds.shape == (len(x), helpers.NUM_CLASSES)
    np.testing.assert_allclose(preds.sum(axis=1), 1.0, rtol=1e-5)
    assert state.num_participations == 2
  # RHPK uses the stored predictions: the same round from a state without
  # history (a first-seen client) trains differently.
  server = process.initialize()
  with_history = process.next(server, list(states), DATA)
  fresh = [process.initial_client_state(str(i)) for i in range(3)]
  without = process.next(server, fresh, DATA)
  assert (with_history.metrics['client_work']['kd_loss_sum']
          != pytest.approx(without.metrics['client_work']['kd_loss_sum']))


def test_history_of_a_different_size_is_ignored(full_run):
  process, (_, states, _) = full_run
  server = process.initialize()
  fresh = [process.initial_client_state(str(i)) for i in range(3)]
  wrong = [s._replace(predictions=np.full((3, helpers.NUM_CLASSES), 1 / 3,
                                          np.float32)) for s in states]
  a = process.next(server, fresh, DATA)
  b = process.next(server, wrong, DATA)
  np.testing.assert_allclose(_flat(a.server_state.global_model_weights),
                             _flat(b.server_state.global_model_weights),
                             atol=1e-6)


def test_personalized_model_is_the_locally_trained_model(full_run):
  process, (server, states, _) = full_run
  evaluated = process.evaluate(server, states, DATA)
  assert set(evaluated) == {'personal', 'global'}
  personal = [np.asarray(s.personal_weights.trainable[0]) for s in states]
  glob = np.asarray(server.global_model_weights.trainable[0])
  assert all(np.abs(p - glob).max() > 1e-4 for p in personal)


def test_fused_label():
  h = fedpsd.fused_label(tf.constant([[0.2, 0.8, 0.0]]), tf.constant([0]),
                         tf.constant(0.25), 3)
  np.testing.assert_allclose(h.numpy(), [[0.8, 0.2, 0.0]], rtol=1e-6)


def test_bad_configuration_is_rejected():
  with pytest.raises(ValueError, match='index'):
    fedpsd.build_fedpsd(
        BASE, initial_weights=W0, total_rounds=3,
        client_optimizer=tff.learning.optimizers.build_sgdm(LR))
  with pytest.raises(ValueError, match='total_rounds'):
    fedpsd.build_fedpsd(
        SPEC, initial_weights=W0,
        client_optimizer=tff.learning.optimizers.build_sgdm(LR))


def test_registry_passes_total_rounds_from_run_context():
  process = registry.build(
      'fedpsd', SPEC, initial_weights=W0,
      client_optimizer=tff.learning.optimizers.build_sgdm(LR),
      run_context=dict(num_clients=3, total_rounds=10))
  assert process.name == 'fedpsd'
  with pytest.raises(ValueError, match='total_rounds'):
    registry.build('fedpsd', SPEC, initial_weights=W0, total_rounds=3,
                   client_optimizer=tff.learning.optimizers.build_sgdm(LR))
