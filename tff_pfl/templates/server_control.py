"""Server-side pieces for methods that keep a server value besides the model.

SCAFFOLD (Karimireddy et al., ICML 2020) keeps a server control variate c
and FedCurv (Shoham et al., 2019) keeps the Fisher sums U = sum_j F_j and
V = sum_j F_j * theta_j. In both, each client uploads two things:

* a model pseudo-gradient, averaged with the clients' example counts as in
  FedAvg and applied to the global model with the server optimizer;
* a correction of the server value (SCAFFOLD's delta c_i, FedCurv's changes
  of (F_i, F_i * theta_i)), which the server SUMS over the sampled clients
  and folds into its value with a method-specific rule:
  SCAFFOLD c <- c + (1/N) * sum_i delta c_i (Karimireddy et al., Alg. 1,
  line 17), FedCurv (U, V) <- (U, V) + sum_i (delta U_i, delta V_i) (or,
  with its `fisher_window='previous_round'`,
  (U, V) <- sum_i (F_i, F_i theta_i)).

So the client's upload is `MeanAndSum(mean=..., sum=...)`, and this module
provides, once for both methods:

* `MeanAndSumFactory`: a `tff.aggregators.WeightedAggregationFactory` that
  aggregates `mean` with an inner weighted factory (default
  `tff.aggregators.MeanFactory()`) and `sum` with
  `tff.aggregators.SumFactory()`, and counts the clients with a positive
  weight;
* `build_server_control`: a `FinalizerProcess` whose state is
  `ServerControlState(optimizer, extra)`. It applies `aggregate.mean` to the
  global model by calling `finalizers.build_optimizer_and_average_finalizer`'s
  `next` (server optimizer on the trainable part, mean of the BatchNorm
  statistics, non-finite aggregates rejected), and updates `extra` with
  `update_extra(extra, aggregate.sum)`; plus the `broadcast_extra`
  computation that hands `extra` to the clients each round
  (`process.compose_personalized_process`).

The summed part must have the type of `extra`. A non-finite sum leaves
`extra` unchanged and is reported as `extra_non_finite` (clients already
zero their upload when their training diverges).
"""

import collections
from collections.abc import Callable
from typing import Any, NamedTuple, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_pfl.templates import finalizers


class MeanAndSum(NamedTuple):
  """A client upload: `mean` is weight-averaged, `sum` is summed."""
  mean: Any
  sum: Any


class ServerControlState(NamedTuple):
  """State of the `build_server_control` finalizer.

  Attributes:
    optimizer: the state of the wrapped optimizer-and-average finalizer (the
      server optimizer's state).
    extra: the server value clients receive in `Broadcast.extra`.
  """
  optimizer: Any
  extra: Any


class ServerControl(NamedTuple):
  """What `build_server_control` returns, for `compose_with_global_model`."""
  finalizer: tff.learning.templates.FinalizerProcess
  broadcast_extra: tff.Computation


class MeanAndSumFactory(tff.aggregators.WeightedAggregationFactory):
  """Weighted mean of `MeanAndSum.mean`, plain sum of `MeanAndSum.sum`.

  The client weight only weighs the `mean` part: a client that must not
  contribute (weight 0, e.g. after non-finite training) has to send a zero
  `sum` part itself.
  """

  def __init__(self, mean_factory: Optional[
      tff.aggregators.WeightedAggregationFactory] = None):
    if mean_factory is None:
      mean_factory = tff.aggregators.MeanFactory()
    if not isinstance(mean_factory,
                      tff.aggregators.WeightedAggregationFactory):
      raise TypeError('mean_factory must be a weighted aggregation factory, '
                      f'got {type(mean_factory).__name__}.')
    self._mean_factory = mean_factory

  def create(self, value_type, weight_type):
    if (not isinstance(value_type, tff.StructType)
        or [n for n, _ in tff.structure.iter_elements(value_type)]
        != list(MeanAndSum._fields)):
      raise TypeError('MeanAndSumFactory needs a MeanAndSum(mean, sum) value '
                      f'type, got {value_type}.')
    mean_process = self._mean_factory.create(value_type.mean, weight_type)
    sum_process = tff.aggregators.SumFactory().create(value_type.sum)

    @tff.tensorflow.computation(weight_type)
    def contributes(weight):
      return tf.cast(weight > 0, tf.int32)

    @tff.federated_computation
    def init_fn():
      return tff.federated_zip(collections.OrderedDict(
          mean=mean_process.initialize(), sum=sum_process.initialize()))

    @tff.federated_computation(
        init_fn.type_signature.result,
        tff.FederatedType(value_type, tff.CLIENTS),
        tff.FederatedType(weight_type, tff.CLIENTS))
    def next_fn(state, value, weight):
      mean_out = mean_process.next(state.mean, value.mean, weight)
      sum_out = sum_process.next(state.sum, value.sum)
      result = tff.federated_zip(MeanAndSum(mean=mean_out.result,
                                            sum=sum_out.result))
      new_state = tff.federated_zip(collections.OrderedDict(
          mean=mean_out.state, sum=sum_out.state))
      measurements = tff.federated_zip(collections.OrderedDict(
          mean=mean_out.measurements, sum=sum_out.measurements,
          num_contributing=tff.federated_sum(
              tff.federated_map(contributes, weight))))
      return tff.templates.MeasuredProcessOutput(new_state, result,
                                                 measurements)

    return tff.templates.AggregationProcess(init_fn, next_fn)


def build_server_control(
    server_optimizer: tff.learning.optimizers.Optimizer,
    weights_type: tff.Type,
    *,
    initial_extra: Any,
    update_extra: Callable[[Any, Any], Any],
) -> ServerControl:
  """Builds the finalizer and `broadcast_extra` for a `MeanAndSum` upload.

  Args:
    server_optimizer: applies `aggregate.mean` (a `ModelWeights`-shaped mean
      pseudo-gradient plus BN statistics) to the global model, as
      `finalizers.build_optimizer_and_average_finalizer`, which it wraps.
    weights_type: the model's `ModelWeights` TFF type.
    initial_extra: the initial server value, a structure of NumPy arrays
      (e.g. a list of zeros shaped like the trainable weights).
    update_extra: TensorFlow function `(extra, summed) -> new extra`, where
      `summed` (the `sum` part of the aggregate) has the type of `extra`.

  Returns:
    `ServerControl(finalizer, broadcast_extra)`: a `FinalizerProcess` of
    type `(<ServerControlState@SERVER, W@SERVER, MeanAndSum(W, X)@SERVER>
    -> <state, result=W@SERVER, measurements>)` and a computation
    `(ServerControlState -> X)` reading `extra`.
  """
  inner = finalizers.build_optimizer_and_average_finalizer(server_optimizer,
                                                           weights_type)
  frozen_extra = initial_extra

  @tff.tensorflow.computation
  def initial_extra_fn():
    return tf.nest.map_structure(tf.constant, frozen_extra)

  extra_type = initial_extra_fn.type_signature.result

  @tff.tensorflow.computation(extra_type, extra_type)
  def apply_sum(extra, summed):
    new_extra = update_extra(extra, summed)
    finite = tf.reduce_all([
        tf.reduce_all(tf.math.is_finite(t))
        for t in tf.nest.flatten(new_extra)] + [tf.constant(True)])
    kept = tf.nest.map_structure(lambda new, old: tf.where(finite, new, old),
                                 new_extra, extra)
    return kept, tf.cast(tf.logical_not(finite), tf.int32)

  @tff.federated_computation
  def initialize():
    return tff.federated_zip(ServerControlState(
        optimizer=inner.initialize(),
        extra=tff.federated_eval(initial_extra_fn, tff.SERVER)))

  state_type = initialize.type_signature.result
  aggregate_type = tff.types.tensorflow_to_type(
      MeanAndSum(mean=weights_type, sum=extra_type))

  @tff.federated_computation(
      state_type, tff.FederatedType(weights_type, tff.SERVER),
      tff.FederatedType(aggregate_type, tff.SERVER))
  def next_fn(state, weights, aggregate):
    out = inner.next(state.optimizer, weights, aggregate.mean)
    new_extra, extra_non_finite = tff.federated_map(
        apply_sum, (state.extra, aggregate.sum))
    return tff.templates.MeasuredProcessOutput(
        state=tff.federated_zip(ServerControlState(optimizer=out.state,
                                                   extra=new_extra)),
        result=out.result,
        measurements=tff.federated_zip(collections.OrderedDict(
            update_non_finite=out.measurements.update_non_finite,
            extra_non_finite=extra_non_finite)))

  @tff.tensorflow.computation(state_type.member)
  def broadcast_extra(state):
    return state.extra

  return ServerControl(
      finalizer=tff.learning.templates.FinalizerProcess(initialize, next_fn),
      broadcast_extra=broadcast_extra)


def zeros_like_trainable(weights: Any) -> list[np.ndarray]:
  """Float32 zeros shaped like `weights.trainable` (NumPy `ModelWeights`)."""
  return [np.zeros(np.shape(w), np.float32) for w in weights.trainable]
