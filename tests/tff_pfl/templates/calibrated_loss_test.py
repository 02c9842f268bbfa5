"""Tests of the calibrated cross-entropy (FedPSD Eq. 8) and soft-target KL."""

import numpy as np
import tensorflow as tf

from tff_pfl.templates import calibrated_loss
from tff_pfl.templates import client_works
from tff_pfl.templates import distillation


def _np_log_softmax(z):
  z = z - z.max(axis=-1, keepdims=True)
  return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def test_calibrated_cross_entropy_matches_eq8():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(5, 4)).astype(np.float32)
  labels = np.array([0, 1, 1, 3, 0])
  counts = np.array([2., 2., 0., 1.], np.float32)   # class 2 absent
  got = calibrated_loss.calibrated_cross_entropy(labels, logits, counts)
  prior = counts / counts.sum()
  expected = []
  for z, y in zip(logits, labels):
    present = counts > 0
    num = prior[y] * np.exp(z[y])
    den = np.sum(prior[present] * np.exp(z[present]))
    expected.append(-np.log(num / den))
  np.testing.assert_allclose(got.numpy(), np.mean(expected), rtol=1e-5)


def test_absent_classes_are_masked_not_nan():
  logits = tf.Variable(tf.constant([[50.0, -3.0, 2.0], [0.0, 1.0, 2.0]]))
  labels = tf.constant([1, 1])
  counts = tf.constant([0.0, 5.0, 0.0])   # only class 1 present
  with tf.GradientTape() as tape:
    loss = calibrated_loss.calibrated_cross_entropy(labels, logits, counts)
  grad = tape.gradient(loss, logits)
  assert np.isfinite(loss.numpy()) and np.isfinite(grad.numpy()).all()
  # With a single present class the calibrated loss is 0 and absent logits
  # get no gradient.
  np.testing.assert_allclose(loss.numpy(), 0.0, atol=1e-6)
  np.testing.assert_allclose(grad.numpy()[:, [0, 2]], 0.0, atol=1e-12)


def test_uniform_prior_is_plain_cross_entropy():
  rng = np.random.default_rng(1)
  logits = rng.normal(size=(6, 3)).astype(np.float32)
  labels = np.array([0, 1, 2, 2, 1, 0])
  got = calibrated_loss.calibrated_cross_entropy(labels, logits,
                                                 np.ones(3, np.float32))
  plain = -np.mean(_np_log_softmax(logits)[np.arange(6), labels])
  np.testing.assert_allclose(got.numpy(), plain, rtol=1e-5)
  skewed = calibrated_loss.calibrated_cross_entropy(
      labels, logits, np.array([10., 1., 1.], np.float32))
  assert abs(float(skewed) - plain) > 1e-3


def test_label_counts():
  ds = tf.data.Dataset.from_tensor_slices(
      dict(y=np.array([0, 2, 2, 2, 0], np.int64))).batch(2)
  np.testing.assert_array_equal(
      client_works.label_counts(ds, 4).numpy(), [2, 0, 3, 0])


def test_soft_target_kl_matches_numpy_and_one_hot_is_cross_entropy():
  rng = np.random.default_rng(2)
  logits = rng.normal(size=(4, 3)).astype(np.float32)
  teacher = np.array([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5], [1, 0, 0],
                      [0.1, 0.1, 0.8]], np.float32)
  log_p = _np_log_softmax(logits)
  expected = np.mean([
      sum(t * (np.log(t) - lp) for t, lp in zip(row, lrow) if t > 0)
      for row, lrow in zip(teacher, log_p)])
  got = distillation.soft_target_kl(teacher, logits)
  np.testing.assert_allclose(got.numpy(), expected, rtol=1e-5)
  one_hot = np.eye(3, dtype=np.float32)[[0, 2, 1, 1]]
  np.testing.assert_allclose(
      distillation.soft_target_kl(one_hot, logits).numpy(),
      -np.mean(log_p[np.arange(4), [0, 2, 1, 1]]), rtol=1e-5)
  np.testing.assert_allclose(
      distillation.soft_target_kl(tf.nn.softmax(logits), logits).numpy(), 0.0,
      atol=1e-6)
