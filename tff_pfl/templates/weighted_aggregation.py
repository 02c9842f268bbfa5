"""Weighted mean by a client-reported scalar, as a `tff.aggregators` factory.

AFedCL's consensus-aware aggregation (Eq. 8) weights client k by its
reported discrimination loss L_D^k:  x = sum_k s_k x_k / sum_k s_k. A score
sent by a client cannot be trusted as is, so each one is sanitised before
use: a non-finite or negative score counts as 0, and scores are clipped to
`max_score`. When the sanitised scores sum to zero (every client
reported 0, NaN or a negative value) the mean falls back to the
sample-count weights.

Clipping bounds a score, not a share: when the other clients' scores are
near zero, a client at any positive score still gets all the weight
(AFedCL on NEU-CLS after 200 rounds: four clients at L_D ~ 1e-11 or 0,
one at 5.5, which got 100 % of Eq. 8's weight; docs/results.md).
`count_mix` = beta mixes the two means,

    x = (1 - beta) sum_k s_k x_k / sum_k s_k + beta sum_k n_k x_k / sum_k n_k,

so client k's share is at most (1 - beta) + beta n_k / sum_k n_k. The
default beta = 0 is Eq. 8 as written.

The weight each client sends is `ScoreWeight(score, num_examples)`. With
`use_score=False` the factory is the plain sample-weighted mean (AFedCL's
"CAA off" ablation), so both variants share one type signature.
"""

import collections
from typing import NamedTuple

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff


class ScoreWeight(NamedTuple):
  """A client's aggregation weight: its score and its example count."""
  score: tf.Tensor
  num_examples: tf.Tensor


class ScoreWeightedMeanFactory(tff.aggregators.WeightedAggregationFactory):
  """Mean weighted by sanitised client scores; see the module docstring."""

  def __init__(self, *, max_score: float = 10.0, use_score: bool = True,
               count_mix: float = 0.0):
    if not max_score > 0:
      raise ValueError(f'max_score must be > 0, got {max_score}.')
    if not 0.0 <= count_mix <= 1.0:
      raise ValueError(f'count_mix must be in [0, 1], got {count_mix}.')
    self._max_score = float(max_score)
    self._use_score = use_score
    self._count_mix = float(count_mix)

  def create(self, value_type, weight_type):
    expected = tff.types.tensorflow_to_type(ScoreWeight(
        tf.TensorSpec([], tf.float32), tf.TensorSpec([], tf.float32)))
    if not weight_type.is_equivalent_to(expected):
      raise TypeError('ScoreWeightedMeanFactory needs the weight type '
                      f'ScoreWeight(float32, float32), got {weight_type}.')
    max_score, use_score = self._max_score, self._use_score
    beta = self._count_mix

    @tff.tensorflow.computation(weight_type)
    def sanitize(weight):
      s = tf.where(tf.math.is_finite(weight.score), weight.score, 0.0)
      s = tf.clip_by_value(s, 0.0, max_score)
      if not use_score:
        s = tf.zeros_like(s)
      n = tf.maximum(weight.num_examples, 0.0)
      return s, n

    @tff.tensorflow.computation(value_type, np.float32, np.float32)
    def scale(value, s, n):
      return (tf.nest.map_structure(lambda v: v * s, value),
              tf.nest.map_structure(lambda v: v * n, value))

    @tff.tensorflow.computation(value_type, value_type, np.float32,
                                np.float32)
    def divide(by_score, by_count, score_sum, count_sum):
      use = score_sum > 0.0

      def mean(a, b):
        by_counts = b / tf.maximum(count_sum, 1e-12)
        by_scores = a / tf.maximum(score_sum, 1e-12)
        if beta:
          by_scores = (1.0 - beta) * by_scores + beta * by_counts
        return tf.where(use, by_scores, by_counts)

      return tf.nest.map_structure(mean, by_score, by_count)

    @tff.tensorflow.computation(np.float32)
    def fell_back(score_sum):
      return tf.cast(score_sum <= 0.0, tf.int32)

    @tff.federated_computation
    def init_fn():
      return tff.federated_value((), tff.SERVER)

    @tff.federated_computation(
        init_fn.type_signature.result,
        tff.FederatedType(value_type, tff.CLIENTS),
        tff.FederatedType(weight_type, tff.CLIENTS))
    def next_fn(state, value, weight):
      s, n = tff.federated_map(sanitize, weight)
      by_score, by_count = tff.federated_map(scale, (value, s, n))
      score_sum = tff.federated_sum(s)
      count_sum = tff.federated_sum(n)
      result = tff.federated_map(divide, (
          tff.federated_sum(by_score), tff.federated_sum(by_count),
          score_sum, count_sum))
      measurements = tff.federated_zip(collections.OrderedDict(
          score_sum=score_sum,
          fell_back_to_counts=tff.federated_map(fell_back, score_sum)))
      return tff.templates.MeasuredProcessOutput(state, result, measurements)

    return tff.templates.AggregationProcess(init_fn, next_fn)
