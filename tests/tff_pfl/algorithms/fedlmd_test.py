"""Tests for tff_pfl.algorithms.fedlmd (label-masking distillation)."""

import functools

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_pfl.algorithms import fedlmd
from tff_pfl.algorithms import fedntd
from tff_pfl.algorithms import registry
from tff_pfl.core import model_spec
from tff_pfl.templates import client_works

from tests.tff_pfl import conftest as helpers
from tests.tff_pfl.algorithms import eager_reference as eager

K = helpers.NUM_CLASSES
SPEC = helpers.make_spec()
W0 = SPEC.initial_weights(seed=7)
ARRAYS = helpers.make_client_arrays(3)        # each client lacks one class
DATA = [helpers.to_dataset(x, y) for x, y in ARRAYS]
COUNTS = [eager.num_examples(d) for d in DATA]
LR, EPOCHS, BETA, TAU = 0.1, 2, 5.0, 2.0


def _balanced_data():
  rng = np.random.default_rng(3)
  out = []
  for i in range(3):
    x = (rng.normal(size=(24, helpers.NUM_FEATURES)) + i).astype(np.float32)
    y = rng.permutation(np.repeat(np.arange(K), 8)).astype(np.int64)
    out.append(helpers.to_dataset(x, y))
  return out


BALANCED = _balanced_data()


@functools.cache
def _process(beta):
  return fedlmd.build_fedlmd(
      SPEC, initial_weights=W0,
      client_optimizer=tff.learning.optimizers.build_sgdm(LR),
      local_epochs=EPOCHS, beta=beta, temperature=TAU)


def _round(beta, data):
  process = _process(beta)
  state = process.initialize()
  states = [process.initial_client_state(str(i)) for i in range(len(data))]
  return process.next(state, states, list(data))


def _np_major(dataset):
  labels = np.concatenate([b['y'].numpy() for b in dataset])
  counts = np.bincount(labels, minlength=K)
  return counts > counts.mean()


def _forward(loss_fn):
  teacher = SPEC.keras_model_fn()
  model_spec.assign_weights(teacher, W0)

  def forward(model, batch):
    logits = model(batch['x'], training=True)
    return logits, loss_fn(batch['y'], logits, teacher(batch['x']))

  return forward


def _eager_round(data, loss_fn_for):
  """(global trainable weights, summed per-client mean extra term)."""
  results = [eager.local_sgd(SPEC, W0, d, epochs=EPOCHS, lr=LR,
                             forward_fn=_forward(loss_fn_for(d)))
             for d in data]
  counts = [eager.num_examples(d) for d in data]
  return (eager.weighted_mean([w for w, _ in results], counts),
          sum(e for _, e in results))


def _lmd_for(dataset):
  major = tf.constant(_np_major(dataset))
  return lambda y, s, t: fedlmd.lmd_loss(y, s, t, major, beta=BETA,
                                         temperature=TAU)


def _ntd_for(dataset):
  del dataset
  return lambda y, s, t: fedntd.ntd_loss(y, s, t, beta=BETA,
                                         temperature=TAU)


def test_major_labels_use_the_mean_over_all_classes():
  ds = helpers.to_dataset(np.zeros((5, helpers.NUM_FEATURES), np.float32),
                          np.array([0, 1, 0, 1, 0], np.int64), batch_size=2)
  counts = client_works.label_counts(ds, K)
  np.testing.assert_array_equal(counts.numpy(), [3.0, 2.0, 0.0])
  # Mean over all 3 classes is 5/3: classes 0 and 1 are major (a mean over
  # the present classes, 2.5, would make only class 0 major).
  np.testing.assert_array_equal(fedlmd.major_label_mask(counts).numpy(),
                                [True, True, False])
  assert not fedlmd.major_label_mask(tf.constant([4.0, 4.0, 4.0])).numpy(
  ).any()


def test_lmd_loss_masks_major_labels_in_the_teacher_only():
  rng = np.random.default_rng(0)
  student = rng.normal(size=(4, 4)).astype(np.float32)
  teacher = rng.normal(size=(4, 4)).astype(np.float32)
  labels = np.array([0, 1, 2, 3])
  major = np.array([True, True, False, False])
  got = float(fedlmd.lmd_loss(labels, student, teacher, major, beta=2.0,
                              temperature=0.5))
  rows = []
  for i, y in enumerate(labels):
    not_true = np.arange(4) != y
    t_keep = not_true & ~major
    t = teacher[i][t_keep] / 0.5
    p = np.exp(t - t.max()) / np.exp(t - t.max()).sum()
    s = student[i] / 0.5
    log_q = s - s.max() - np.log(np.exp(s[not_true] - s.max()).sum())
    rows.append(np.sum(p * (np.log(p) - log_q[t_keep])))
  assert got == pytest.approx(2.0 * 0.25 * np.mean(rows), rel=1e-5)
  # Rows 2 and 3 have one minor not-true class each: a one-hot teacher.
  assert rows[2] == pytest.approx(-np.log(
      np.exp(student[2][3] / 0.5) /
      np.exp(student[2][[0, 1, 3]] / 0.5).sum()), rel=1e-5)
  # With no major label it is FedNTD's loss.
  none = np.zeros(4, bool)
  assert float(fedlmd.lmd_loss(labels, student, teacher, none, beta=2.0,
                               temperature=0.5)) == pytest.approx(
                                   float(fedntd.ntd_loss(
                                       labels, student, teacher, beta=2.0,
                                       temperature=0.5)), rel=1e-6)
  # A true label that is the only minor label leaves the teacher nothing:
  # that example contributes 0, and nothing is NaN.
  only_minor = np.array([True, True, True, False])
  got = fedlmd.lmd_loss(np.array([3]), student[:1], teacher[:1], only_minor,
                        beta=1.0, temperature=1.0)
  assert float(got) == 0.0


def test_beta_zero_is_fedavg():
  state, _, metrics = _round(0.0, DATA)
  locals_ = [eager.local_sgd(SPEC, W0, d, epochs=EPOCHS, lr=LR)[0]
             for d in DATA]
  eager.assert_weights_close(state.global_model_weights.trainable,
                             eager.weighted_mean(locals_, COUNTS),
                             atol=1e-5)
  assert metrics['client_work']['distillation_loss'] == 0.0


def test_round_matches_eager_lmd_objective_and_differs_from_fedntd():
  state, _, metrics = _round(BETA, DATA)
  expected, distill = _eager_round(DATA, _lmd_for)
  eager.assert_weights_close(state.global_model_weights.trainable, expected,
                             atol=1e-5)
  assert metrics['client_work']['distillation_loss'] == pytest.approx(
      distill, rel=1e-4)
  # Counts [15, 9, 0], [0, 9, 15], [16, 8, 0]: the means over all 3 classes
  # are 8, so 2 + 2 + 1 major labels (8 is not above 8).
  assert metrics['client_work']['num_major_labels'] == sum(
      _np_major(d).sum() for d in DATA) == 5
  ntd_global, _ = _eager_round(DATA, _ntd_for)
  assert max(np.abs(a - b).max() for a, b in zip(
      state.global_model_weights.trainable, ntd_global)) > 1e-3


def test_equally_frequent_labels_make_it_fedntd():
  state, _, metrics = _round(BETA, BALANCED)
  assert metrics['client_work']['num_major_labels'] == 0
  expected, distill = _eager_round(BALANCED, _ntd_for)
  eager.assert_weights_close(state.global_model_weights.trainable, expected,
                             atol=1e-5)
  assert distill > 0


def test_bad_arguments_and_registry():
  opt = tff.learning.optimizers.build_sgdm(LR)
  with pytest.raises(ValueError, match='beta'):
    fedlmd.build_fedlmd(SPEC, initial_weights=W0, client_optimizer=opt,
                        beta=float('nan'))
  with pytest.raises(ValueError, match='temperature'):
    fedlmd.build_fedlmd(SPEC, initial_weights=W0, client_optimizer=opt,
                        temperature=-1.0)
  info = registry.ALGORITHMS['fedlmd']
  assert info.build is fedlmd.build_fedlmd
  assert 'beta' in info.description
