"""Tests of the weight-decay wrapper for TFF optimizers."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_pfl.templates import optimizers


def _steps(optimizer, w, g, n=3):
  specs = (tf.TensorSpec(w.shape, tf.float32),)
  state = optimizer.initialize(specs)
  weights = (tf.constant(w),)
  for _ in range(n):
    state, weights = optimizer.next(state, weights, (tf.constant(g),))
  return state, weights[0].numpy()


def test_weight_decay_matches_pytorch_style_momentum_sgd():
  w0 = np.array([1.0, -2.0, 0.5], np.float32)
  g = np.array([0.1, 0.2, -0.3], np.float32)
  lr, rho, wd = 0.1, 0.9, 0.01
  opt = optimizers.with_weight_decay(
      tff.learning.optimizers.build_sgdm(lr, momentum=rho), wd)
  _, got = _steps(opt, w0, g)
  w, m = w0.copy(), np.zeros_like(w0)
  for _ in range(3):     # PyTorch SGD: d = g + wd w; m = rho m + d; w -= lr m
    m = rho * m + (g + wd * w)
    w = w - lr * m
  np.testing.assert_allclose(got, w, rtol=1e-6)
  _, plain = _steps(tff.learning.optimizers.build_sgdm(lr, momentum=rho),
                    w0, g)
  assert np.abs(plain - got).max() > 1e-4


def test_hparams_pass_through_and_zero_is_identity():
  inner = tff.learning.optimizers.build_sgdm(0.1, momentum=0.9)
  assert optimizers.with_weight_decay(inner, 0.0) is inner
  opt = optimizers.with_weight_decay(inner, 1e-5)
  state = opt.initialize((tf.TensorSpec([2], tf.float32),))
  hparams = opt.get_hparams(state)
  assert hparams['learning_rate'] == pytest.approx(0.1)
  hparams['learning_rate'] = 0.05
  state = opt.set_hparams(state, hparams)
  assert opt.get_hparams(state)['learning_rate'] == pytest.approx(0.05)
  with pytest.raises(ValueError, match='weight_decay'):
    optimizers.with_weight_decay(inner, -1.0)
