"""Tests for tff_pfl.templates.contrastive (MOON's l_con)."""

import numpy as np
import pytest
import tensorflow as tf

from tff_pfl.templates import contrastive


def _np_cos(a, b):
  a = np.asarray(a, np.float64).reshape(len(a), -1)
  b = np.asarray(b, np.float64).reshape(len(b), -1)
  na = np.maximum(np.linalg.norm(a, axis=1), 1e-6)
  nb = np.maximum(np.linalg.norm(b, axis=1), 1e-6)
  return (a * b).sum(axis=1) / (na * nb)


def _np_l_con(z, z_glob, z_prev, tau):
  pos = np.exp(_np_cos(z, z_glob) / tau)
  neg = np.exp(_np_cos(z, z_prev) / tau)
  return float(np.mean(-np.log(pos / (pos + neg))))


RNG = np.random.default_rng(1)
Z, ZG, ZP = (RNG.normal(size=(5, 7)).astype(np.float32) for _ in range(3))


@pytest.mark.parametrize('tau', [0.1, 0.5, 1.0])
def test_matches_numpy(tau):
  got = contrastive.model_contrastive_loss(Z, ZG, ZP, tau)
  assert float(got) == pytest.approx(_np_l_con(Z, ZG, ZP, tau), rel=1e-5)


def test_log_two_and_zero_gradient_when_global_equals_previous():
  z = tf.Variable(Z)
  with tf.GradientTape() as tape:
    loss = contrastive.model_contrastive_loss(z, ZG, ZG, 0.5)
  assert float(loss) == pytest.approx(np.log(2.0), rel=1e-6)
  np.testing.assert_allclose(tape.gradient(loss, z).numpy(), 0.0, atol=1e-7)


def test_pulls_towards_global_and_away_from_previous():
  # z equal to z_glob and opposite to z_prev: sims are 1 and -1.
  tau = 0.5
  got = float(contrastive.model_contrastive_loss(ZG, ZG, -ZG, tau))
  assert got == pytest.approx(np.log1p(np.exp(-2.0 / tau)), rel=1e-5)
  assert got < np.log(2.0) < float(
      contrastive.model_contrastive_loss(ZP, ZG, ZP, tau))


def test_rank_4_features_and_zero_vectors_are_finite():
  z = RNG.normal(size=(3, 2, 2, 2)).astype(np.float32)
  zg = RNG.normal(size=(3, 2, 2, 2)).astype(np.float32)
  zp = np.zeros_like(z)          # e.g. a dead ReLU encoder
  got = contrastive.model_contrastive_loss(z, zg, zp, 0.5)
  assert float(got) == pytest.approx(_np_l_con(z, zg, zp, 0.5), rel=1e-5)
  zero = tf.Variable(np.zeros((2, 4), np.float32))
  with tf.GradientTape() as tape:
    loss = contrastive.model_contrastive_loss(zero, Z[:2, :4], Z[2:4, :4],
                                              0.5)
  assert float(loss) == pytest.approx(np.log(2.0))
  assert np.all(np.isfinite(tape.gradient(loss, zero).numpy()))


def test_bad_temperature():
  with pytest.raises(ValueError, match='temperature'):
    contrastive.model_contrastive_loss(Z, ZG, ZP, 0.0)
