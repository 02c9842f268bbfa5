"""Tests for tff_pfl.templates.weighted_aggregation (AFedCL Eq. 8)."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_pfl.templates import weighted_aggregation as wa

VALUE = tff.TensorType(np.float32, [2])
WEIGHT = tff.types.tensorflow_to_type(wa.ScoreWeight(
    tf.TensorSpec([], tf.float32), tf.TensorSpec([], tf.float32)))
VALUES = [np.array([1.0, 0.0], np.float32), np.array([3.0, 2.0], np.float32),
          np.array([5.0, 4.0], np.float32)]


def _aggregate(scores, counts=(1.0, 1.0, 2.0), **kwargs):
  process = wa.ScoreWeightedMeanFactory(**kwargs).create(VALUE, WEIGHT)
  weights = [wa.ScoreWeight(np.float32(s), np.float32(n))
             for s, n in zip(scores, counts)]
  out = process.next(process.initialize(), VALUES, weights)
  return np.asarray(out.result), out.measurements


def test_weights_by_reported_score():
  result, m = _aggregate([1.0, 3.0, 0.0])
  np.testing.assert_allclose(result, (1 * VALUES[0] + 3 * VALUES[1]) / 4)
  assert m['fell_back_to_counts'] == 0


def test_bad_scores_are_sanitised_and_clipped():
  # NaN and negative count as 0; 1e9 is clipped to max_score=2.
  result, _ = _aggregate([np.nan, -5.0, 1e9], max_score=2.0)
  np.testing.assert_allclose(result, VALUES[2])
  result, _ = _aggregate([1.0, 1e9, 0.0], max_score=1.0)
  np.testing.assert_allclose(result, (VALUES[0] + VALUES[1]) / 2)


def test_zero_scores_fall_back_to_counts_and_switch_off():
  expected = (VALUES[0] + VALUES[1] + 2 * VALUES[2]) / 4
  result, m = _aggregate([0.0, np.nan, -1.0])
  np.testing.assert_allclose(result, expected, rtol=1e-6)
  assert m['fell_back_to_counts'] == 1
  result, _ = _aggregate([1.0, 3.0, 0.0], use_score=False)
  np.testing.assert_allclose(result, expected, rtol=1e-6)


def test_count_mix_bounds_one_clients_share():
  # The clip bounds a score, not a share: with the others at 0, a client
  # at any positive score takes the whole mean (Eq. 8 as written).
  result, _ = _aggregate([5.5, 0.0, 0.0])
  np.testing.assert_allclose(result, VALUES[0])
  by_counts = (VALUES[0] + VALUES[1] + 2 * VALUES[2]) / 4
  # beta = 0.5: client 0's share is 0.5 + 0.5 * 1/4.
  result, _ = _aggregate([5.5, 0.0, 0.0], count_mix=0.5)
  np.testing.assert_allclose(result, 0.5 * VALUES[0] + 0.5 * by_counts,
                             rtol=1e-6)
  result, m = _aggregate([1.0, 3.0, 0.0], count_mix=1.0)
  np.testing.assert_allclose(result, by_counts, rtol=1e-6)
  assert m['fell_back_to_counts'] == 0
  for bad in (-0.1, 1.5):
    with pytest.raises(ValueError, match='count_mix'):
      wa.ScoreWeightedMeanFactory(count_mix=bad)


def test_wrong_weight_type_is_rejected():
  with pytest.raises(TypeError, match='ScoreWeight'):
    wa.ScoreWeightedMeanFactory().create(VALUE, tff.TensorType(np.float32))
  with pytest.raises(ValueError, match='max_score'):
    wa.ScoreWeightedMeanFactory(max_score=0.0)
