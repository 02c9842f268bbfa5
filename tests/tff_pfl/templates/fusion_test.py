"""Tests for tff_pfl.templates.fusion (AFedCL Eqs. 5 and 9, Fig. 4(b))."""

import numpy as np
import pytest
import tensorflow as tf

from tff_pfl.templates import fusion


def test_fusion_weight_stays_in_unit_interval():
  a = fusion.fusion_weight(tf.constant([-1e4, -3.0, 0.0, 3.0, 1e4]))
  assert np.all((a.numpy() >= 0.0) & (a.numpy() <= 1.0))
  assert float(a[2]) == 0.5


def test_fuse_is_eq9():
  g = tf.constant([[1.0, 2.0]])
  l = tf.constant([[3.0, -1.0]])
  logit = tf.constant(np.log(0.25 / 0.75), tf.float32)   # A = 0.25
  np.testing.assert_allclose(fusion.fuse(g, l, logit).numpy(),
                             [[0.25 * 1 + 0.75 * 3, 0.25 * 2 - 0.75]],
                             rtol=1e-6)


def test_discrimination_loss_is_eq5():
  local = tf.constant([[0.5], [-2.0], [1.0]])
  glob = tf.constant([[3.0], [-0.5], [0.0]])
  sig = lambda z: 1.0 / (1.0 + np.exp(-z))
  want = -(np.log(1 - sig(np.array([0.5, -2.0, 1.0]))).sum() +
           np.log(sig(np.array([3.0, -0.5, 0.0]))).sum()) / 6
  assert float(fusion.discrimination_loss(local, glob)) == pytest.approx(
      want, rel=1e-6)
  # A discriminator that outputs 0 everywhere cannot tell them apart.
  zeros = tf.zeros([4, 1])
  assert float(fusion.discrimination_loss(zeros, zeros)) == pytest.approx(
      np.log(2.0), rel=1e-6)


def test_discrimination_accuracy():
  # Local right: -2 (and not 0.5, 1.0); global right: 3.0 (not -0.5, 0.0).
  local = tf.constant([[0.5], [-2.0], [1.0]])
  glob = tf.constant([[3.0], [-0.5], [0.0]])
  assert float(fusion.discrimination_accuracy(local, glob)) == pytest.approx(
      0.5 * (1 / 3 + 1 / 3))
  perfect = fusion.discrimination_accuracy(-tf.ones([5, 1]), tf.ones([2, 1]))
  assert float(perfect) == 1.0
