"""Tests for tff_pfl.algorithms.fedntd (not-true distillation)."""

import collections
import functools

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_pfl.algorithms import fedntd
from tff_pfl.algorithms import registry
from tff_pfl.core import model_spec

from tests.tff_pfl import conftest as helpers
from tests.tff_pfl.algorithms import eager_reference as eager

SPEC = helpers.make_spec()
W0 = SPEC.initial_weights(seed=6)
ARRAYS = helpers.make_client_arrays(3)
DATA = [helpers.to_dataset(x, y) for x, y in ARRAYS]
COUNTS = [eager.num_examples(d) for d in DATA]
LR, EPOCHS, BETA, TAU = 0.1, 2, 5.0, 2.0


@functools.cache
def _process(beta):
  return fedntd.build_fedntd(
      SPEC, initial_weights=W0,
      client_optimizer=tff.learning.optimizers.build_sgdm(LR),
      local_epochs=EPOCHS, beta=beta, temperature=TAU)


def _round(beta, data=tuple(DATA)):
  process = _process(beta)
  state = process.initialize()
  states = [process.initial_client_state(str(i)) for i in range(len(data))]
  return process.next(state, states, list(data))


def _ntd_forward(global_weights):
  teacher = SPEC.keras_model_fn()
  model_spec.assign_weights(teacher, global_weights)

  def forward(model, batch):
    logits = model(batch['x'], training=True)
    return logits, fedntd.ntd_loss(batch['y'], logits, teacher(batch['x']),
                                   beta=BETA, temperature=TAU)

  return forward


def test_beta_zero_is_fedavg():
  state, _, metrics = _round(0.0)
  locals_ = [eager.local_sgd(SPEC, W0, d, epochs=EPOCHS, lr=LR)[0]
             for d in DATA]
  eager.assert_weights_close(state.global_model_weights.trainable,
                             eager.weighted_mean(locals_, COUNTS),
                             atol=1e-5)
  assert metrics['client_work']['distillation_loss'] == 0.0


def test_round_matches_eager_ntd_objective_and_differs_from_fedavg():
  state, _, metrics = _round(BETA)
  results = [eager.local_sgd(SPEC, W0, d, epochs=EPOCHS, lr=LR,
                             forward_fn=_ntd_forward(W0)) for d in DATA]
  expected = eager.weighted_mean([w for w, _ in results], COUNTS)
  eager.assert_weights_close(state.global_model_weights.trainable, expected,
                             atol=1e-5)
  distill = sum(e for _, e in results)
  assert distill > 0
  assert metrics['client_work']['distillation_loss'] == pytest.approx(
      distill, rel=1e-4)
  # The distillation term changed the round's global update.
  fedavg_global = eager.weighted_mean(
      [eager.local_sgd(SPEC, W0, d, epochs=EPOCHS, lr=LR)[0] for d in DATA],
      COUNTS)
  assert max(np.abs(a - b).max() for a, b in zip(
      state.global_model_weights.trainable, fedavg_global)) > 1e-3


def test_round_two_distils_from_the_broadcast_global_model():
  # The teacher is the global model the round receives (shared with FedLMD
  # through `build_global_teacher_client_work`), not the initial model.
  process = _process(BETA)
  state1, states1, _ = _round(BETA)
  state2, _, _ = process.next(state1, list(states1), DATA)
  start = state1.global_model_weights
  results = [eager.local_sgd(SPEC, start, d, epochs=EPOCHS, lr=LR,
                             forward_fn=_ntd_forward(start)) for d in DATA]
  eager.assert_weights_close(
      state2.global_model_weights.trainable,
      eager.weighted_mean([w for w, _ in results], COUNTS), atol=1e-5)
  stale = [eager.local_sgd(SPEC, start, d, epochs=EPOCHS, lr=LR,
                           forward_fn=_ntd_forward(W0))[0] for d in DATA]
  assert max(np.abs(a - b).max() for a, b in zip(
      state2.global_model_weights.trainable,
      eager.weighted_mean(stale, COUNTS))) > 1e-4


def test_ntd_loss_on_a_batch():
  x, y = ARRAYS[0][0][:8], ARRAYS[0][1][:8]
  model = SPEC.keras_model_fn()
  model_spec.assign_weights(model, W0)
  logits = model(x)
  # Global == local model: the not-true KL is 0.
  assert float(fedntd.ntd_loss(y, logits, logits, beta=1.0,
                               temperature=TAU)) == pytest.approx(0.0,
                                                                  abs=1e-6)
  # beta * tau^2 * KL, and the true-class logit of the student is ignored.
  other = logits + tf.random.stateless_normal(logits.shape, seed=[1, 2])
  base = fedntd.ntd_loss(y, other, logits, beta=1.0, temperature=TAU)
  assert float(fedntd.ntd_loss(y, other, logits, beta=3.0,
                               temperature=TAU)) == pytest.approx(
                                   3.0 * float(base), rel=1e-6)
  shifted = other + 10.0 * tf.one_hot(y, helpers.NUM_CLASSES)
  assert float(fedntd.ntd_loss(y, shifted, logits, beta=1.0,
                               temperature=TAU)) == pytest.approx(
                                   float(base), rel=1e-5)


def test_diverging_client_is_dropped():
  bad_x = np.full_like(ARRAYS[2][0], 1e30)
  data = DATA[:2] + [helpers.to_dataset(bad_x, ARRAYS[2][1])]
  state, _, metrics = _round(BETA, tuple(data))
  assert metrics['client_work']['non_finite'] == 1.0
  results = [eager.local_sgd(SPEC, W0, d, epochs=EPOCHS, lr=LR,
                             forward_fn=_ntd_forward(W0)) for d in DATA[:2]]
  eager.assert_weights_close(
      state.global_model_weights.trainable,
      eager.weighted_mean([w for w, _ in results], COUNTS[:2]), atol=1e-5)


def test_bad_arguments_and_registry():
  opt = tff.learning.optimizers.build_sgdm(LR)
  with pytest.raises(ValueError, match='beta'):
    fedntd.build_fedntd(SPEC, initial_weights=W0, client_optimizer=opt,
                        beta=-1.0)
  with pytest.raises(ValueError, match='temperature'):
    fedntd.build_fedntd(SPEC, initial_weights=W0, client_optimizer=opt,
                        temperature=0.0)
  regression = model_spec.ModelSpec(
      SPEC.keras_model_fn,
      collections.OrderedDict(
          x=tf.TensorSpec([None, helpers.NUM_FEATURES], tf.float32),
          y=tf.TensorSpec([None], tf.float32)),
      'regression', helpers.NUM_CLASSES)
  with pytest.raises(ValueError, match='classification'):
    fedntd.build_fedntd(regression, initial_weights=W0, client_optimizer=opt)
  info = registry.ALGORITHMS['fedntd']
  assert info.build is fedntd.build_fedntd
  assert 'beta' in info.description
