"""Server-side finalizer: optimizer step on trainable weights, mean of the rest.

TFF's `build_apply_optimizer_finalizer` applies the server optimizer to the
trainable weights and passes `non_trainable` weights through unchanged, so the
server's BatchNorm moving statistics stay at their initial values forever
(field guide pitfall 3) and a global BN model is evaluated with statistics it
never learned. This finalizer takes an aggregate shaped like `ModelWeights`:

* `aggregate.trainable`: the weighted mean of client pseudo-gradients
  `initial - trained` (TFF's convention), applied with the server optimizer
  as descent, `w <- opt.next(state, w, aggregate.trainable)`;
* `aggregate.non_trainable`: the weighted mean of the clients' final
  non-trainable values (BatchNorm moving mean/variance), which replaces the
  server's values. A model without non-trainable weights is unaffected.

A non-finite aggregate is rejected: weights and optimizer state are kept and
`update_non_finite` reports 1, as TFF's finalizer does.
"""

import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

ModelWeights = tff.learning.models.ModelWeights


def build_optimizer_and_average_finalizer(
    optimizer: tff.learning.optimizers.Optimizer,
    weights_type: tff.Type,
) -> tff.learning.templates.FinalizerProcess:
  """Builds the finalizer for `weights_type` (a `ModelWeights` struct type)."""
  trainable_specs = tf.nest.map_structure(
      lambda t: tf.TensorSpec(t.shape, t.dtype),
      tff.types.type_to_tf_tensor_specs(weights_type.trainable))

  @tff.tensorflow.computation
  def init_fn():
    # A tuple, like the weights `apply` passes to `optimizer.next`: TFF's
    # optimizers check that state (e.g. the momentum accumulator) and weights
    # have the same structure, and a list does not match a tuple.
    return optimizer.initialize(tuple(trainable_specs))

  opt_state_type = init_fn.type_signature.result

  @tff.federated_computation
  def initialize():
    return tff.federated_eval(init_fn, tff.SERVER)

  @tff.tensorflow.computation(opt_state_type, weights_type, weights_type)
  def apply(opt_state, weights, aggregate):
    finite = tf.reduce_all([
        tf.reduce_all(tf.math.is_finite(t))
        for t in tf.nest.flatten(aggregate)] + [tf.constant(True)])
    new_state, new_trainable = optimizer.next(
        opt_state, tuple(weights.trainable), tuple(aggregate.trainable))
    new_weights = ModelWeights(
        trainable=list(new_trainable),
        non_trainable=list(aggregate.non_trainable))
    pick = lambda a, b: tf.nest.map_structure(
        lambda x, y: tf.where(finite, x, y), a, b)
    out_weights = pick(new_weights, ModelWeights(
        trainable=list(weights.trainable),
        non_trainable=list(weights.non_trainable)))
    out_state = pick(new_state, opt_state)
    return out_state, out_weights, tf.cast(tf.logical_not(finite), tf.int32)

  @tff.federated_computation(
      tff.FederatedType(opt_state_type, tff.SERVER),
      tff.FederatedType(weights_type, tff.SERVER),
      tff.FederatedType(weights_type, tff.SERVER))
  def next_fn(state, weights, aggregate):
    new_state, new_weights, non_finite = tff.federated_map(
        apply, (state, weights, aggregate))
    return tff.templates.MeasuredProcessOutput(
        state=new_state, result=new_weights,
        measurements=tff.federated_zip(
            collections.OrderedDict(update_non_finite=non_finite)))

  return tff.learning.templates.FinalizerProcess(initialize, next_fn)
