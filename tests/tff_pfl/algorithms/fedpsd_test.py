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
  # Training stayed finite (a NaN client would be dropped with weight 0 and
  # also "change" the global model).
  assert on_metrics[0]['non_finite'] == 0 and off_metrics[0]['non_finite'] == 0
  diff = np.abs(_flat(on_state.global_model_weights)
                - _flat(off_state.global_model_weights)).max()
  assert diff > 1e-4
  if switch in ('rhpk', 'psd'):
    assert on_metrics[0]['kd_loss_sum'] > 0
    assert off_metrics[0]['kd_loss_sum'] == 0
  else:
    assert on_metrics[0]['loss_sum'] != pytest.approx(
        off_metrics[0]['loss_sum'], rel=1e-4)


def _eager_fedpsd(rounds, *, rhpk, psd, cll, total_rounds=4, epochs=3):
  """Independent eager FedPSD (Eqs. 1-9) on ARRAYS: plain SGD, batches of 8
  in order, FedAvg of the clients' weights (equal sizes). Returns the global
  trainable weights, each client's stored predictions and each client's
  trainable weights after its last local training."""
  weights = [np.asarray(w) for w in W0.trainable]
  history = [None] * len(ARRAYS)
  c = helpers.NUM_CLASSES
  for t in range(rounds):
    alpha = min((t + 1) / total_rounds, 1.0)                   # Eq. 2
    trained = []
    for k, (x, y) in enumerate(ARRAYS):
      model = SPEC.keras_model_fn()
      for v, w in zip(model.trainable_variables, weights):
        v.assign(w)
      onehot = np.eye(c, dtype=np.float32)[y]
      present = np.flatnonzero(np.bincount(y, minlength=c))
      log_prior = np.log(np.bincount(y, minlength=c)[present] / len(y))
      position = {cls: i for i, cls in enumerate(present)}
      # Epoch 1: the stored predictions of the last participation (Eq. 1),
      # or Y alone for a first-seen client.
      teacher = (onehot if history[k] is None
                 else alpha * history[k] + (1 - alpha) * onehot)
      use_kd = rhpk
      for _ in range(epochs):
        predictions = np.zeros((len(y), c), np.float32)
        for start in range(0, len(y), 8):
          xb, yb = x[start:start + 8], y[start:start + 8]
          h = tf.constant(teacher[start:start + 8])
          with tf.GradientTape() as tape:
            logits = model(xb, training=True)
            if cll:     # Eqs. 7-8: only the client's classes, plus ln P(y)
              cal = tf.gather(logits, present, axis=1) + log_prior
              ce = tf.keras.losses.sparse_categorical_crossentropy(
                  [position[v] for v in yb], cal, from_logits=True)
            else:
              ce = tf.keras.losses.sparse_categorical_crossentropy(
                  yb, logits, from_logits=True)
            log_p = tf.nn.log_softmax(logits)
            kl = tf.reduce_sum(tf.where(
                h > 0, h * (tf.math.log(tf.where(h > 0, h, 1.0)) - log_p),
                0.0), axis=1)                                    # Eq. 4
            loss = tf.reduce_mean(ce) + (tf.reduce_mean(kl) if use_kd
                                         else 0.0)               # Eq. 9
          predictions[start:start + 8] = tf.nn.softmax(logits).numpy()
          grads = tape.gradient(loss, model.trainable_variables)
          for v, g in zip(model.trainable_variables, grads):
            v.assign_sub(LR * g)
        teacher = alpha * predictions + (1 - alpha) * onehot     # Eq. 3
        use_kd = psd
      history[k] = predictions
      trained.append([v.numpy() for v in model.trainable_variables])
    weights = [np.mean([w[i] for w in trained], axis=0)
               for i in range(len(weights))]
  return weights, history, trained


@pytest.mark.parametrize('switches', [
    dict(rhpk=True, psd=True, cll=True),
    dict(rhpk=True, psd=False, cll=False)], ids=['all', 'rhpk_only'])
def test_two_rounds_match_an_eager_reference(switches, full_run):
  """Round 2 recalls round 1's stored predictions, so this checks RHPK with
  history, PSD's epoch-to-epoch teacher and the calibrated loss together."""
  if all(switches.values()):
    _, (state, states, metrics) = full_run
  else:
    state, states, metrics = _run(_build(**switches), rounds=2)
  assert all(m['non_finite'] == 0 for m in metrics)
  want_weights, want_history, _ = _eager_fedpsd(2, **switches)
  for got, want in zip(state.global_model_weights.trainable, want_weights):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
  for s, want in zip(states, want_history):
    np.testing.assert_allclose(s.predictions, want, rtol=1e-4, atol=1e-5)


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
  # Each client's model after round 2's local training (before averaging).
  _, _, trained = _eager_fedpsd(2, rhpk=True, psd=True, cll=True)
  for s, want in zip(states, trained):
    for got, w in zip(s.personal_weights.trainable, want):
      np.testing.assert_allclose(got, w, rtol=1e-4, atol=1e-5)
  # And it is evaluated as such: the loss of client 0's personal model.
  model = SPEC.keras_model_fn()
  model_spec.assign_weights(model, states[0].personal_weights)
  x, y = ARRAYS[0]
  loss = float(tf.reduce_sum(tf.keras.losses.sparse_categorical_crossentropy(
      y, model(x), from_logits=True)))
  assert evaluated['personal'][0]['loss_sum'] == pytest.approx(loss, rel=1e-4)


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
