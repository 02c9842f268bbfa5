"""Tests for tff_pfl.algorithms.fedala and its ALA template."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_pfl.algorithms import fedala
from tff_pfl.core import model_spec
from tff_pfl.templates import adaptive_local_aggregation as ala_lib

from tests.tff_pfl import conftest as helpers

ModelWeights = tff.learning.models.ModelWeights


def _weights_pair(spec):
  """Distinct global and local weights."""
  return spec.initial_weights(seed=0), spec.initial_weights(seed=1)


def _client_dataset(n=24, batch_size=8, client=1):
  x, y = helpers.make_client_arrays(client + 1, n=n)[client]
  return helpers.to_dataset(x, y, batch_size)


def _ones_like_top(weights, layer_idx):
  return [np.ones_like(w, np.float32) for w in weights.trainable[-layer_idx:]]


def _reference_pass(spec, global_w, local_w, ala_w, batches, eta, layer_idx):
  """One eager pass of PFLlib's weight learning, written out."""
  model = spec.keras_model_fn()
  model_spec.assign_weights(model, global_w)
  top = model.trainable_variables[-layer_idx:]
  g_top = global_w.trainable[-layer_idx:]
  l_top = local_w.trainable[-layer_idx:]
  w = [tf.constant(x) for x in ala_w]
  for batch in batches:
    for v, l, g, wi in zip(top, l_top, g_top, w):
      v.assign(l + (g - l) * wi)
    with tf.GradientTape() as tape:
      loss = spec.loss(batch['y'], model(batch['x'], training=True))
    grads = tape.gradient(loss, top)
    w = [tf.clip_by_value(wi - eta * gr * (g - l), 0.0, 1.0)
         for wi, gr, l, g in zip(w, grads, l_top, g_top)]
  return [x.numpy() for x in w]


def test_ala_mixes_top_tensors_and_learns_w_like_pfllib():
  spec = helpers.make_spec(batch_norm=True)
  global_w, local_w = _weights_pair(spec)
  # Local BatchNorm statistics differ from the global ones.
  local_w = ModelWeights(
      trainable=local_w.trainable,
      non_trainable=[np.full_like(t, 0.5) for t in local_w.non_trainable])
  dataset = _client_dataset()   # 3 batches; 50% -> the first 2.
  ala = ala_lib.build_adaptive_local_aggregation(
      spec, layer_idx=2, eta=1.0, rand_percent=50)
  ones = _ones_like_top(global_w, 2)
  out = ala(spec.keras_model_fn(), global_w, local_w, ones, dataset,
            tf.constant(False))
  assert int(out.num_passes) == 1

  trainable = [t.numpy() for t in out.weights.trainable]
  for got, want in zip(trainable[:-2], global_w.trainable[:-2]):
    np.testing.assert_array_equal(got, want)
  # BatchNorm statistics stay local (PFLlib mixes parameters() only).
  assert out.weights.non_trainable
  for got, want in zip(out.weights.non_trainable, local_w.non_trainable):
    np.testing.assert_array_equal(got.numpy(), want)
  for got, g, l in zip(trainable[-2:], global_w.trainable[-2:],
                       local_w.trainable[-2:]):
    assert np.all(got >= np.minimum(g, l) - 1e-6)
    assert np.all(got <= np.maximum(g, l) + 1e-6)
  # The head is a genuine mix: neither the global nor the local kernel.
  assert not np.allclose(trainable[-2], global_w.trainable[-2])
  assert not np.allclose(trainable[-2], local_w.trainable[-2])

  learned = [w.numpy() for w in out.ala_weights]
  for w in learned:
    assert np.all((w >= 0.0) & (w <= 1.0))
  assert not all(np.all(w == 1.0) for w in learned)
  want = _reference_pass(spec, global_w, local_w, ones,
                         list(dataset.take(2)), 1.0, 2)
  for got, ref in zip(learned, want):
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
  # theta_hat is the combination with the learned W.
  for got, g, l, w in zip(trainable[-2:], global_w.trainable[-2:],
                          local_w.trainable[-2:], learned):
    np.testing.assert_allclose(got, l + (g - l) * w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('threshold,start_phase,expected', [
    (1e9, True, 4),      # converged as soon as num_pre_loss + 1 losses exist
    (1e-12, True, 7),    # never converges: stops at max_start_iterations
    (1e-12, False, 1),   # outside the start phase: exactly one pass
])
def test_start_phase_number_of_passes(threshold, start_phase, expected):
  spec = helpers.make_spec()
  global_w, local_w = _weights_pair(spec)
  ala = ala_lib.build_adaptive_local_aggregation(
      spec, layer_idx=2, eta=0.1, rand_percent=80, threshold=threshold,
      num_pre_loss=3, max_start_iterations=7)
  out = ala(spec.keras_model_fn(), global_w, local_w,
            _ones_like_top(global_w, 2), _client_dataset(),
            tf.constant(start_phase))
  assert int(out.num_passes) == expected
  assert float(out.loss) > 0.0


def test_batch_counting_and_sampling():
  dataset = _client_dataset()
  unknown = dataset.filter(lambda _: True)
  assert int(unknown.cardinality()) < 0
  assert int(ala_lib.count_batches(unknown)) == 3
  assert int(ala_lib.count_batches(dataset)) == 3
  for num_batches, percent, want in [(3, 80, 3), (3, 50, 2), (3, 1, 1),
                                     (3, 100, 3), (10, 70, 7), (0, 80, 1)]:
    got = ala_lib.num_sampled_batches(tf.constant(num_batches, tf.int64),
                                      percent)
    assert int(got) == want, (num_batches, percent)


def test_fixed_w_gives_global_or_local_model():
  """With W frozen (tiny eta), W = 1 is the global and W = 0 the local model.

  layer_idx covers every trainable tensor, so nothing is copied from the
  global model without passing through W.
  """
  spec = helpers.make_spec()
  global_w, local_w = _weights_pair(spec)
  num = len(global_w.trainable)
  ala = ala_lib.build_adaptive_local_aggregation(
      spec, layer_idx=num, eta=1e-12, rand_percent=100)
  model = spec.keras_model_fn()
  ones = _ones_like_top(global_w, num)
  out = ala(model, global_w, local_w, ones, _client_dataset(),
            tf.constant(False))
  for w in out.ala_weights:
    np.testing.assert_array_equal(w.numpy(), 1.0)
  for got, want in zip(out.weights.trainable, global_w.trainable):
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=1e-6)

  zeros = [np.zeros_like(w) for w in ones]
  out = ala(model, global_w, local_w, zeros, _client_dataset(),
            tf.constant(False))
  for got, want in zip(out.weights.trainable, local_w.trainable):
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=1e-6)

  # An empty dataset: no pass, W unchanged.
  empty = _client_dataset().take(0)
  out = ala(model, global_w, local_w, zeros, empty, tf.constant(True))
  assert int(out.num_passes) == 0
  for w in out.ala_weights:
    np.testing.assert_array_equal(w.numpy(), 0.0)


def _eager_sgd(spec, weights, dataset, lr):
  model = spec.keras_model_fn()
  model_spec.assign_weights(model, weights)
  for batch in dataset:
    with tf.GradientTape() as tape:
      loss = spec.loss(batch['y'], model(batch['x'], training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    for v, g in zip(model.trainable_variables, grads):
      v.assign_sub(lr * g)
  return [v.numpy() for v in model.trainable_variables]


def test_rounds_personalize_and_end_start_phase():
  spec = helpers.make_spec()
  w0 = spec.initial_weights(seed=0)
  arrays = helpers.make_client_arrays(4)
  # Client 4 diverges: its features are huge.
  arrays.append((np.full_like(arrays[0][0], 1e30), arrays[0][1]))
  data = [helpers.to_dataset(x, y) for x, y in arrays]
  process = fedala.build_fedala(
      spec, initial_weights=w0,
      client_optimizer=tff.learning.optimizers.build_sgdm(0.1),
      num_pre_loss=3, max_start_iterations=20)
  state = process.initialize()
  states = {c: process.initial_client_state(str(c)) for c in range(5)}

  def run_round(state, cohort, num_bad=0):
    state, new, metrics = process.next(
        state, [states[c] for c in cohort], [data[c] for c in cohort])
    states.update(zip(cohort, new))
    assert metrics['client_work']['non_finite'] == num_bad
    assert metrics['client_work']['num_examples'] == 24.0 * len(cohort)
    return state

  # Round 1: the first receive is a plain copy of the global model.
  state = run_round(state, [0, 1, 4], num_bad=1)
  for w in state.global_model_weights.trainable:
    assert np.all(np.isfinite(w))
  # The diverged client keeps its state, participation count included.
  assert int(states[4].initialized) == 0
  assert int(states[4].num_participations) == 0
  for got, want in zip(states[4].model_weights.trainable, w0.trainable):
    np.testing.assert_array_equal(got, want)
  for c in (0, 1):
    want = _eager_sgd(spec, w0, data[c], 0.1)
    for got, ref in zip(states[c].model_weights.trainable, want):
      np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    assert int(states[c].initialized) == 1
    assert int(states[c].start_phase) == 1
    for w in states[c].ala_weights:
      np.testing.assert_array_equal(w, 1.0)

  state = run_round(state, [0, 1])
  state = run_round(state, [0, 2])
  for c in (0, 1):   # seen twice or more: ALA ran, start phase over
    assert int(states[c].start_phase) == 0
    assert not all(np.all(w == 1.0) for w in states[c].ala_weights)
  assert int(states[2].start_phase) == 1   # seen once: no ALA yet
  assert int(states[2].initialized) == 1
  assert int(states[3].initialized) == 0   # never seen
  assert [int(states[c].num_participations) for c in range(4)] == [3, 2, 1, 0]
  heads = [states[c].model_weights.trainable[-2] for c in range(3)]
  for i in range(3):
    for j in range(i + 1, 3):
      assert not np.allclose(heads[i], heads[j])

  results = process.evaluate(state, [states[c] for c in range(4)], data[:4])
  assert set(results) == {'personal', 'global'}
  personal = [r['loss_sum'] for r in results['personal']]
  global_ = [r['loss_sum'] for r in results['global']]
  # A client that never took part is evaluated with the global model.
  assert personal[3] == pytest.approx(global_[3], rel=1e-5)
  assert personal[0] != pytest.approx(global_[0], rel=1e-3)


def test_an_initialized_client_keeps_its_own_batch_norm_statistics():
  """From its second round on, a client normalises with its own moving
  statistics: the global model's (the average of the uploads) do not reach
  its model, while its first round copies them."""
  spec = helpers.make_spec(batch_norm=True)
  data = [helpers.to_dataset(x, y) for x, y in helpers.make_client_arrays(2)]
  process = fedala.build_fedala(
      spec, initial_weights=spec.initial_weights(seed=0),
      client_optimizer=tff.learning.optimizers.build_sgdm(0.1))
  # `other`: another global moving mean and variance, same trainable weights.
  state, other, states = helpers.round_then_shift_statistics(process, data)
  _, a, _ = process.next(state, list(states), data)
  _, b, _ = process.next(other, list(states), data)
  for x, y in zip(a, b):
    assert x.model_weights.non_trainable
    for u, v in zip(x.model_weights.trainable + x.model_weights.non_trainable,
                    y.model_weights.trainable + y.model_weights.non_trainable):
      np.testing.assert_allclose(u, v, rtol=1e-6, atol=1e-7)
  # A first-time client starts from the global model, statistics included.
  fresh = [process.initial_client_state(str(i)) for i in range(2)]
  _, c, _ = process.next(state, fresh, data)
  _, d, _ = process.next(other, fresh, data)
  assert not np.allclose(c[0].model_weights.non_trainable[0],
                         d[0].model_weights.non_trainable[0])


def test_frozen_w_equals_fedavg():
  """eta ~ 0 keeps W = 1: FedALA is FedAvg (clients start from the global).

  The reference is FedAvg written out eagerly: equal-sized clients, so the
  new global model is the plain mean of the clients' SGD results.
  """
  spec = helpers.make_spec()
  w0 = spec.initial_weights(seed=3)
  data = [helpers.to_dataset(x, y) for x, y in helpers.make_client_arrays(2)]
  process = fedala.build_fedala(
      spec, initial_weights=w0, eta=1e-12,
      client_optimizer=tff.learning.optimizers.build_sgdm(0.1))
  state = process.initialize()
  states = [process.initial_client_state(str(i)) for i in range(2)]
  reference = w0
  for _ in range(2):
    state, states, _ = process.next(state, states, data)
    reference = helpers.eager_fedavg_round(spec, reference, data, epochs=1,
                                           lr=0.1)
  for got, want in zip(state.global_model_weights.trainable,
                       reference.trainable):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  for client_state in states:   # ALA ran in round 2 and left W at ones
    assert int(client_state.start_phase) == 0
    for w in client_state.ala_weights:
      np.testing.assert_array_equal(w, 1.0)


@pytest.mark.parametrize('name,value', [
    ('eta', 0.0), ('eta', -1.0), ('rand_percent', 0),
    ('rand_percent', 101), ('layer_idx', 0), ('layer_idx', 5),
    ('threshold', 0.0), ('num_pre_loss', 0), ('max_start_iterations', 0),
])
def test_bad_arguments_raise(name, value):
  spec = helpers.make_spec()   # 4 trainable tensors
  with pytest.raises(ValueError, match=name):
    fedala.build_fedala(
        spec, initial_weights=spec.initial_weights(seed=0),
        client_optimizer=tff.learning.optimizers.build_sgdm(0.1),
        **{name: value})
