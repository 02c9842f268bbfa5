"""Tests for tff_pfl.algorithms.moon (model-contrastive FL)."""

import collections
import functools

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

import keras_models
from tff_pfl.algorithms import moon
from tff_pfl.algorithms import registry
from tff_pfl.core import model_spec
from tff_pfl.templates import contrastive

from tests.tff_pfl import conftest as helpers
from tests.tff_pfl.algorithms import eager_reference as eager


def _spec():
  return model_spec.ModelSpec(
      lambda: keras_models.build_model('mlp', (helpers.NUM_FEATURES,),
                                       helpers.NUM_CLASSES,
                                       encoder_options={'hidden': (8,)}),
      collections.OrderedDict(
          x=tf.TensorSpec([None, helpers.NUM_FEATURES], tf.float32),
          y=tf.TensorSpec([None], tf.int64)),
      'classification', helpers.NUM_CLASSES)


SPEC = _spec()
W0 = SPEC.initial_weights(seed=5)
DATA = [helpers.to_dataset(x, y) for x, y in helpers.make_client_arrays(3)]
LR, EPOCHS, MU, TAU = 0.1, 2, 5.0, 0.5
COUNTS = [eager.num_examples(d) for d in DATA]


def _optimizer():
  return tff.learning.optimizers.build_sgdm(LR)


@functools.cache
def _rounds(mu, rounds=2):
  """MOON's [(server_state, client_states, metrics)] after each round."""
  process = moon.build_moon(SPEC, initial_weights=W0,
                            client_optimizer=_optimizer(),
                            local_epochs=EPOCHS, mu=mu, temperature=TAU)
  state = process.initialize()
  states = [process.initial_client_state(str(i)) for i in range(3)]
  out = []
  for _ in range(rounds):
    state, states, metrics = process.next(state, states, DATA)
    out.append((state, states, metrics))
  return process, out


def _eager_fedavg_round(weights):
  """FedAvg's round from `weights`: (new global, client local models)."""
  locals_ = [eager.local_sgd(SPEC, weights, d, epochs=EPOCHS, lr=LR)[0]
             for d in DATA]
  return eager.weighted_mean(locals_, COUNTS), locals_


def _moon_forward(global_weights, previous_weights):
  glob, prev = SPEC.keras_model_fn(), SPEC.keras_model_fn()
  model_spec.assign_weights(glob, global_weights)
  model_spec.assign_weights(prev, previous_weights)

  def forward(model, batch):
    z = model.get_layer('encoder')(batch['x'], training=True)
    l_con = contrastive.model_contrastive_loss(
        z, glob.get_layer('encoder')(batch['x']),
        prev.get_layer('encoder')(batch['x']), TAU)
    return model.get_layer('head')(z, training=True), MU * l_con

  return forward


def test_mu_zero_is_fedavg():
  _, rounds = _rounds(0.0)
  weights = W0
  for state, _, _ in rounds:
    expected, _ = _eager_fedavg_round(weights)
    eager.assert_weights_close(state.global_model_weights.trainable,
                               expected, atol=1e-5)
    weights = state.global_model_weights
  assert not np.allclose(weights.trainable[0], W0.trainable[0])


def test_first_participation_is_fedavg_and_stores_the_local_model():
  _, ((state, states, metrics), _) = _rounds(MU)
  expected, locals_ = _eager_fedavg_round(W0)
  # The previous model is the global model: l_con = log 2 with zero
  # gradient, so the first round is exactly FedAvg's.
  eager.assert_weights_close(state.global_model_weights.trainable, expected,
                             atol=1e-5)
  assert metrics['client_work']['contrastive_loss'] == pytest.approx(
      3 * MU * np.log(2.0), rel=1e-5)
  for k in range(3):
    eager.assert_weights_close(states[k].previous_weights.trainable,
                               locals_[k], atol=1e-5)
    assert states[k].num_participations == 1


def test_second_round_matches_eager_moon_objective():
  """Round 2: CE + mu l_con(global, previous) with the right models."""
  _, ((state1, states1, _), (state2, states2, metrics)) = _rounds(MU)
  locals_, l_cons = [], []
  for k in range(3):
    forward = _moon_forward(state1.global_model_weights,
                            states1[k].previous_weights)
    weights, l_con = eager.local_sgd(SPEC, state1.global_model_weights,
                                     DATA[k], epochs=EPOCHS, lr=LR,
                                     forward_fn=forward)
    eager.assert_weights_close(states2[k].previous_weights.trainable,
                               weights, atol=1e-5)
    locals_.append(weights)
    l_cons.append(l_con)
  eager.assert_weights_close(state2.global_model_weights.trainable,
                             eager.weighted_mean(locals_, COUNTS), atol=1e-5)
  assert metrics['client_work']['contrastive_loss'] == pytest.approx(
      sum(l_cons), rel=1e-4)
  assert sum(l_cons) != pytest.approx(3 * MU * np.log(2.0), rel=1e-3)
  # And the contrastive term changed the round's update w.r.t. FedAvg.
  fedavg_global, _ = _eager_fedavg_round(state1.global_model_weights)
  assert max(np.abs(a - b).max() for a, b in zip(
      state2.global_model_weights.trainable, fedavg_global)) > 1e-3


def test_evaluated_with_the_global_model():
  process, rounds = _rounds(MU)
  state, states, _ = rounds[-1]
  stats = process.evaluate(state, states, DATA)
  assert set(stats) == {'global'}
  assert len(stats['global']) == 3
  # With the global model, not a client's stored previous model.
  model = SPEC.keras_model_fn()
  model_spec.assign_weights(model, state.global_model_weights)
  for k, d in enumerate(DATA):
    loss = sum(float(SPEC.loss(b['y'], model(b['x']))) * len(b['y'])
               for b in d)
    assert stats['global'][k]['loss_sum'] == pytest.approx(loss, rel=1e-5)


def test_bad_arguments_and_registry():
  opt = _optimizer()
  with pytest.raises(ValueError, match='mu'):
    moon.build_moon(SPEC, initial_weights=W0, client_optimizer=opt, mu=-1.0)
  with pytest.raises(ValueError, match='temperature'):
    moon.build_moon(SPEC, initial_weights=W0, client_optimizer=opt,
                    temperature=0.0)
  plain = helpers.make_spec()
  with pytest.raises(ValueError, match="'encoder' and 'head'"):
    moon.build_moon(plain, initial_weights=plain.initial_weights(0),
                    client_optimizer=opt)
  info = registry.ALGORITHMS['moon']
  assert info.build is moon.build_moon
  assert 'mu' in info.description and 'temperature' in info.description
