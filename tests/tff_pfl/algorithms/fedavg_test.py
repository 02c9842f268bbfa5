"""Tests for tff_pfl.algorithms.fedavg."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_pfl.algorithms import fedavg
from tff_pfl.core import model_spec

from tests.tff_pfl import conftest as helpers

ModelWeights = tff.learning.models.ModelWeights


def _run_ours(spec, w0, data, rounds, lr):
  process = fedavg.build_fedavg(
      spec, initial_weights=w0,
      client_optimizer=tff.learning.optimizers.build_sgdm(lr))
  state = process.initialize()
  states = [process.initial_client_state(str(i)) for i in range(len(data))]
  for _ in range(rounds):
    state, states, _ = process.next(state, states, data)
  return process, state, states


def test_equals_tff_build_weighted_fed_avg():
  """Without BatchNorm our FedAvg is TFF's FedAvg, round for round."""
  spec = helpers.make_spec()
  w0 = spec.initial_weights(seed=1)
  arrays = helpers.make_client_arrays(3)
  data = [helpers.to_dataset(x, y) for x, y in arrays]
  _, ours, _ = _run_ours(spec, w0, data, rounds=3, lr=0.1)

  def model_fn():
    return tff.learning.models.from_keras_model(
        spec.keras_model_fn(), input_spec=data[0].element_spec,
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))

  ref = tff.learning.algorithms.build_weighted_fed_avg(
      model_fn,
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0))
  state = ref.initialize()
  state = ref.set_model_weights(state, w0)
  for _ in range(3):
    state = ref.next(state, data).state
  expected = ref.get_model_weights(state)
  for a, b in zip(ours.global_model_weights.trainable, expected.trainable):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  # And training actually moved the model.
  assert not np.allclose(ours.global_model_weights.trainable[0],
                         w0.trainable[0])


def test_batchnorm_statistics_are_aggregated_and_used_in_evaluation():
  spec = helpers.make_spec(batch_norm=True)
  w0 = spec.initial_weights(seed=0)
  arrays = helpers.make_client_arrays(3)
  data = [helpers.to_dataset(x, y) for x, y in arrays]
  process, state, states = _run_ours(spec, w0, data, rounds=2, lr=0.05)
  trained = state.global_model_weights
  # Moving mean/variance left their initial values (zeros / ones).
  for init, now in zip(w0.non_trainable, trained.non_trainable):
    assert not np.allclose(init, now)
  stats = process.evaluate(state, states, data)['global']

  def eager_loss(weights, x, y):
    model = spec.keras_model_fn()
    model_spec.assign_weights(model, weights)
    logits = model(x, training=False)
    return float(tf.reduce_sum(
        tf.keras.losses.sparse_categorical_crossentropy(
            y, logits, from_logits=True)))

  x, y = arrays[0]
  with_trained = eager_loss(ModelWeights(list(trained.trainable),
                                         list(trained.non_trainable)), x, y)
  with_initial = eager_loss(ModelWeights(list(trained.trainable),
                                         list(w0.non_trainable)), x, y)
  assert stats[0]['loss_sum'] == pytest.approx(with_trained, rel=1e-4)
  assert abs(with_trained - with_initial) > 1e-3


def test_diverging_client_is_dropped_from_the_average():
  spec = helpers.make_spec()
  w0 = spec.initial_weights(seed=0)
  arrays = helpers.make_client_arrays(2)
  bad_x = np.full_like(arrays[1][0], 1e30)
  data = [helpers.to_dataset(*arrays[0]),
          helpers.to_dataset(bad_x, arrays[1][1])]
  process = fedavg.build_fedavg(
      spec, initial_weights=w0,
      client_optimizer=tff.learning.optimizers.build_sgdm(0.1))
  state = process.initialize()
  states = [process.initial_client_state(str(i)) for i in range(2)]
  state, _, metrics = process.next(state, states, data)
  assert metrics['client_work']['non_finite'] == 1.0
  for w in state.global_model_weights.trainable:
    assert np.all(np.isfinite(w))
  # The global model is the good client's model alone.
  _, alone, _ = _run_ours(spec, w0, data[:1], rounds=1, lr=0.1)
  for a, b in zip(state.global_model_weights.trainable,
                  alone.global_model_weights.trainable):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_learning_rate_decay_changes_later_rounds_only():
  spec = helpers.make_spec()
  w0 = spec.initial_weights(seed=0)
  data = [helpers.to_dataset(x, y) for x, y in helpers.make_client_arrays(2)]
  finals = []
  for decay in (1.0, 0.5):
    process = fedavg.build_fedavg(
        spec, initial_weights=w0, learning_rate_decay=decay,
        client_optimizer=tff.learning.optimizers.build_sgdm(0.1))
    state = process.initialize()
    states = [process.initial_client_state(str(i)) for i in range(2)]
    weights = []
    for r in range(2):
      state, states, _ = process.next(state, states, data)
      weights.append(state.global_model_weights.trainable[0])
      if r == 0:
        first_global = [np.asarray(w)
                        for w in state.global_model_weights.trainable]
    finals.append(weights)
  np.testing.assert_allclose(finals[0][0], finals[1][0], rtol=1e-6)  # r=0
  assert not np.allclose(finals[0][1], finals[1][1])                 # r=1
  # Round 2 (r=1) trains at 0.1 * 0.5: one round of FedAvg at lr 0.05 from
  # round 1's global model (equal client sizes: a plain mean).
  round1 = tff.learning.models.ModelWeights(trainable=first_global,
                                            non_trainable=[])
  locals_ = [helpers.eager_sgd(spec, round1, d, epochs=1, lr=0.05)
             for d in data]
  np.testing.assert_allclose(
      finals[1][1],
      np.mean([m.trainable_variables[0].numpy() for m in locals_], axis=0),
      rtol=1e-5, atol=1e-6)
