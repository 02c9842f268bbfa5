"""Tests of the MeanAndSum aggregator and the server-control finalizer."""

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_pfl.templates import finalizers
from tff_pfl.templates import server_control

ModelWeights = tff.learning.models.ModelWeights
MeanAndSum = server_control.MeanAndSum

WEIGHTS_TYPE = tff.types.tensorflow_to_type(ModelWeights(
    trainable=[tf.TensorSpec([2], tf.float32)],
    non_trainable=[tf.TensorSpec([1], tf.float32)]))


def test_mean_part_is_weighted_mean_and_sum_part_is_sum():
  value_type = tff.types.tensorflow_to_type(MeanAndSum(
      mean=[tf.TensorSpec([2], tf.float32)],
      sum=[tf.TensorSpec([3], tf.float32)]))
  process = server_control.MeanAndSumFactory().create(
      value_type, tff.TensorType(np.float32))
  assert process.is_weighted
  means = [np.array([1.0, 2.0]), np.array([3.0, -1.0]),
           np.array([100.0, 100.0])]
  sums = [np.array([1.0, 0.0, 2.0]), np.array([0.5, 1.0, -1.0]),
          np.array([0.0, 0.0, 4.0])]
  weights = [1.0, 3.0, 0.0]
  values = [MeanAndSum(mean=[m.astype(np.float32)], sum=[s.astype(np.float32)])
            for m, s in zip(means, sums)]
  out = process.next(process.initialize(), values,
                     [np.float32(w) for w in weights])
  want_mean = sum(w * m for w, m in zip(weights, means)) / sum(weights)
  np.testing.assert_allclose(out.result.mean[0], want_mean, rtol=1e-6)
  # The sum part is not weighted: the weight-0 client's sum counts too.
  np.testing.assert_allclose(out.result.sum[0], sum(sums), rtol=1e-6)
  assert out.measurements['num_contributing'] == 2


def _run_finalizer(process, weights, aggregate, rounds=1):
  state = process.initialize()
  for _ in range(rounds):
    out = process.next(state, weights, aggregate)
    state, weights = out.state, out.result
  return out


def test_finalizer_updates_weights_like_the_standard_one_and_the_extra():
  optimizer = tff.learning.optimizers.build_sgdm(learning_rate=0.5,
                                                 momentum=0.9)
  control = server_control.build_server_control(
      optimizer, WEIGHTS_TYPE,
      initial_extra=[np.array([1.0, -1.0], np.float32)],
      update_extra=lambda extra, summed: [e + 0.25 * s
                                          for e, s in zip(extra, summed)])
  weights = ModelWeights(trainable=[np.array([1.0, 2.0], np.float32)],
                         non_trainable=[np.array([5.0], np.float32)])
  mean = ModelWeights(trainable=[np.array([0.2, -0.4], np.float32)],
                      non_trainable=[np.array([7.0], np.float32)])
  summed = [np.array([4.0, 8.0], np.float32)]
  # Two rounds, so the server optimizer's momentum state matters too.
  got = _run_finalizer(control.finalizer, weights,
                       MeanAndSum(mean=mean, sum=summed), rounds=2)
  want = _run_finalizer(
      finalizers.build_optimizer_and_average_finalizer(optimizer,
                                                       WEIGHTS_TYPE),
      weights, mean, rounds=2)
  np.testing.assert_allclose(got.result.trainable[0],
                             want.result.trainable[0], rtol=1e-6)
  np.testing.assert_allclose(got.result.non_trainable[0], [7.0])
  np.testing.assert_allclose(got.state.extra[0], [1.0 + 2 * 1.0,
                                                  -1.0 + 2 * 2.0])
  assert got.measurements['update_non_finite'] == 0
  assert got.measurements['extra_non_finite'] == 0
  np.testing.assert_allclose(
      control.broadcast_extra(got.state)[0], got.state.extra[0])


def test_non_finite_sum_keeps_the_extra():
  control = server_control.build_server_control(
      tff.learning.optimizers.build_sgdm(learning_rate=1.0), WEIGHTS_TYPE,
      initial_extra=[np.zeros(2, np.float32)],
      update_extra=lambda extra, summed: [e + s
                                          for e, s in zip(extra, summed)])
  weights = ModelWeights(trainable=[np.ones(2, np.float32)],
                         non_trainable=[np.ones(1, np.float32)])
  mean = ModelWeights(trainable=[np.ones(2, np.float32)],
                      non_trainable=[np.ones(1, np.float32)])
  out = _run_finalizer(control.finalizer, weights, MeanAndSum(
      mean=mean, sum=[np.array([np.nan, 1.0], np.float32)]))
  np.testing.assert_array_equal(out.state.extra[0], [0.0, 0.0])
  assert out.measurements['extra_non_finite'] == 1
  np.testing.assert_allclose(out.result.trainable[0], [0.0, 0.0])
