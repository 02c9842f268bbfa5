"""Adaptive Local Aggregation (ALA), the client-side step of FedALA.

Zhang et al., "FedALA: Adaptive Local Aggregation for Personalized Federated
Learning", AAAI 2023. Before local training, a client that holds a local
model theta_l and receives the global model theta_g initializes its model
element-wise between the two on its top `layer_idx` trainable tensors:

    theta_hat_p = theta_l_p + (theta_g_p - theta_l_p) * W_p     (top tensors)
    theta_hat_q = theta_g_q                        (the lower trainable ones)

and learns the aggregation weights W (same shapes as the top tensors, kept
by the client between rounds, initially ones) on a sample of its training
batches, one step per batch:

    W_p <- clip(W_p - eta * grad_{theta_hat_p} L(theta_hat) *
                (theta_g_p - theta_l_p), 0, 1)

recomputing theta_hat after each step. In the client's start phase (its
first ALA) the passes over the sampled batches repeat until the loss has
converged; afterwards one pass per round is done.

This module holds the TensorFlow side of that step, independent of any
process: `build_adaptive_local_aggregation` returns a `tf.function` that
works on a Keras model, weights as tensors and a batched dataset, in eager
mode or inside a `tff.tensorflow.computation`. Non-trainable weights
(BatchNorm moving statistics) of the result are the client's local ones, as
in the reference code (PFLlib `utils/ALA.py` overwrites and mixes
`model.parameters()` only, so the local model keeps its BatchNorm buffers):
the personalized model normalises with statistics of the client's own data.

Sampling: PFLlib takes a random contiguous `rand_percent`% slice of the
client's examples; here the first `ceil(rand_percent / 100 * num_batches)`
batches (at least one) of the given dataset are used, which is a random
sample when the caller's dataset is shuffled per round (the driver's is).

Convergence of the start phase follows PFLlib (`utils/ALA.py`): a loss is
recorded per pass, and the start phase ends once more than `num_pre_loss`
losses exist and the population standard deviation of the last
`num_pre_loss` is below `threshold`. Two differences: the recorded loss is
the example-weighted mean over the pass (PFLlib records the last batch's
loss), and `max_start_iterations` caps the number of passes (PFLlib loops
until convergence, which need not happen).
"""

from collections.abc import Callable, Sequence
import math
import numbers
from typing import Any, NamedTuple

import tensorflow as tf
import tensorflow_federated as tff

from tff_pfl.core import model_spec as model_spec_lib
from tff_pfl.templates import local_training

ModelWeights = tff.learning.models.ModelWeights


class ALAResult(NamedTuple):
  """What one ALA call returns.

  Attributes:
    weights: `ModelWeights`, the ALA-initialized model theta_hat (lower
      trainable tensors and all non-trainable ones from the global model).
    ala_weights: list of float32 tensors, the learned W (one per top
      trainable tensor); the incoming W when learning produced non-finite
      values.
    num_passes: int32 scalar, passes made over the sampled batches (0 when
      the dataset is empty).
    loss: float32 scalar, mean task loss of the last pass (0 if none).
  """
  weights: Any
  ala_weights: Any
  num_passes: Any
  loss: Any


def _is_int(value: Any) -> bool:
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def validate_hyperparameters(
    *,
    num_trainable: int,
    layer_idx: int,
    eta: float,
    rand_percent: float,
    threshold: float,
    num_pre_loss: int,
    max_start_iterations: int,
) -> None:
  """Raises `ValueError` naming the first invalid ALA hyperparameter.

  Args:
    num_trainable: number of trainable tensors of the model.
    layer_idx: number of top trainable tensors aggregated with learned W.
    eta: learning rate of W.
    rand_percent: percentage of the client's batches used to learn W.
    threshold: start-phase convergence threshold on the loss std.
    num_pre_loss: number of recent losses whose std is compared.
    max_start_iterations: cap on start-phase passes.

  Raises:
    ValueError: for the first hyperparameter out of range.
  """
  if not (eta > 0 and math.isfinite(eta)):
    raise ValueError(f'eta must be finite and > 0, got {eta}.')
  if not 0 < rand_percent <= 100:
    raise ValueError(f'rand_percent must be in (0, 100], got {rand_percent}.')
  if not (_is_int(layer_idx) and 1 <= layer_idx <= num_trainable):
    raise ValueError(
        f'layer_idx must be an int in [1, {num_trainable}] (the number of '
        f'trainable tensors of the model), got {layer_idx!r}.')
  if not threshold > 0:
    raise ValueError(f'threshold must be > 0, got {threshold}.')
  if not (_is_int(num_pre_loss) and num_pre_loss >= 1):
    raise ValueError(f'num_pre_loss must be an int >= 1, got '
                     f'{num_pre_loss!r}.')
  if not (_is_int(max_start_iterations) and max_start_iterations >= 1):
    raise ValueError('max_start_iterations must be an int >= 1, got '
                     f'{max_start_iterations!r}.')


def num_trainable_tensors(spec: model_spec_lib.ModelSpec) -> int:
  """Number of trainable tensors of `spec`'s model (builds it once)."""
  return len(spec.weights_type().trainable)


def count_batches(dataset: tf.data.Dataset) -> tf.Tensor:
  """Number of elements of a finite dataset as an int64 scalar.

  Uses the static cardinality when known; inside TFF computations it is
  usually unknown, and the dataset is then counted with a `reduce`.
  """
  cardinality = dataset.cardinality()
  return tf.cond(
      cardinality >= 0,
      lambda: cardinality,
      lambda: dataset.reduce(tf.constant(0, tf.int64), lambda n, _: n + 1))


def num_sampled_batches(num_batches: tf.Tensor,
                        rand_percent: float) -> tf.Tensor:
  """`max(1, ceil(rand_percent / 100 * num_batches))` as int64."""
  n = tf.cast(num_batches, tf.float64)
  # Multiply before dividing: exact for integer percentages (70 * 10 / 100
  # is 7.0, where 0.7 * 10 is 7.000000000000001 and would round up to 8).
  k = tf.math.ceil(n * float(rand_percent) / 100.0)
  return tf.maximum(tf.cast(k, tf.int64), tf.constant(1, tf.int64))


def combine(local_top: Sequence[tf.Tensor], global_top: Sequence[tf.Tensor],
            ala_weights: Sequence[tf.Tensor]) -> list[tf.Tensor]:
  """theta_l + (theta_g - theta_l) * W for each top tensor."""
  return [l + (g - l) * tf.cast(w, l.dtype)
          for l, g, w in zip(local_top, global_top, ala_weights)]


def aggregate_weights(global_weights: Any, local_weights: Any,
                      ala_weights: Sequence[tf.Tensor],
                      layer_idx: int) -> ModelWeights:
  """The ALA model for given W, without learning W.

  Args:
    global_weights: `ModelWeights` received from the server.
    local_weights: the client's local `ModelWeights`.
    ala_weights: W, one tensor per top trainable tensor.
    layer_idx: number of top trainable tensors (`len(ala_weights)`).

  Returns:
    `ModelWeights`: lower trainable tensors from `global_weights`, the top
    `layer_idx` trainable tensors combined, non-trainable tensors from
    `local_weights`.
  """
  global_trainable = list(global_weights.trainable)
  local_trainable = list(local_weights.trainable)
  top = combine(local_trainable[-layer_idx:], global_trainable[-layer_idx:],
                ala_weights)
  return ModelWeights(
      trainable=global_trainable[:-layer_idx] + top,
      non_trainable=list(local_weights.non_trainable))


def build_adaptive_local_aggregation(
    spec: model_spec_lib.ModelSpec,
    *,
    layer_idx: int,
    eta: float = 1.0,
    rand_percent: float = 80,
    threshold: float = 0.01,
    num_pre_loss: int = 10,
    max_start_iterations: int = 100,
) -> Callable[..., ALAResult]:
  """Builds the ALA step as a `tf.function`.

  The function is `ala(model, global_weights, local_weights, ala_weights,
  dataset, start_phase) -> ALAResult`.

  The returned `tf.function` overwrites `model`'s variables (it leaves the
  ALA-initialized model in them, with BatchNorm statistics possibly moved
  by the forward passes: use `ALAResult.weights`, not the variables). The
  forward passes use `training=True`, as PFLlib's temporary model is in
  training mode. W follows the task loss plus `model.losses`.

  Args:
    spec: model spec (provides the task loss).
    layer_idx: number of top trainable tensors aggregated with learned W
      (>= 1; validated against the model's trainable tensors).
    eta: learning rate of W, > 0.
    rand_percent: percentage of the dataset's batches used, in (0, 100].
    threshold: the start phase stops when the std of the last
      `num_pre_loss` pass losses is below it, > 0.
    num_pre_loss: number of recent pass losses in that std, >= 1.
    max_start_iterations: the most passes of the start phase, >= 1.

  Returns:
    The `tf.function`. Its arguments: a Keras `model` built by
    `spec.keras_model_fn`; `global_weights` and `local_weights`, tensor
    `ModelWeights`; `ala_weights`, a list of `layer_idx` float32 tensors
    shaped like the top trainable tensors; a batched `dataset`;
    `start_phase`, a bool scalar (repeat passes until convergence when
    true, one pass otherwise).
  """
  validate_hyperparameters(
      num_trainable=num_trainable_tensors(spec), layer_idx=layer_idx, eta=eta,
      rand_percent=rand_percent, threshold=threshold,
      num_pre_loss=num_pre_loss, max_start_iterations=max_start_iterations)

  @tf.function
  def ala(model, global_weights, local_weights, ala_weights, dataset,
          start_phase):
    global_weights = ModelWeights(
        trainable=list(global_weights.trainable),
        non_trainable=list(global_weights.non_trainable))
    global_top = list(global_weights.trainable)[-layer_idx:]
    local_top = list(local_weights.trainable)[-layer_idx:]
    diffs = [g - l for g, l in zip(global_top, local_top)]
    top_variables = list(model.trainable_variables)[-layer_idx:]
    initial_w = tuple(tf.convert_to_tensor(w, tf.float32)
                      for w in ala_weights)
    # Lower layers: the global ones; non-trainable: the local ones (the
    # passes run in training mode, so these do not change W).
    model_spec_lib.assign_weights(model, ModelWeights(
        trainable=list(global_weights.trainable),
        non_trainable=list(local_weights.non_trainable)))

    num_batches = count_batches(dataset)
    sampled = dataset.take(num_sampled_batches(num_batches, rand_percent))

    def step(state, batch):
      w, loss_sum, num = state
      for v, t in zip(top_variables, combine(local_top, global_top, w)):
        v.assign(t)
      with tf.GradientTape() as tape:
        outputs = model(batch['x'], training=True)
        task_loss = spec.loss(batch['y'], outputs)
        loss = task_loss
        if model.losses:
          loss += tf.add_n(model.losses)
      grads = tape.gradient(loss, top_variables)
      new_w = tuple(
          tf.clip_by_value(
              wi - eta * tf.cast(
                  (tf.zeros_like(d) if g is None else g) * d, tf.float32),
              0.0, 1.0)
          for wi, g, d in zip(w, grads, diffs))
      n = tf.cast(tf.shape(batch['y'])[0], tf.float32)
      return new_w, loss_sum + tf.cast(task_loss, tf.float32) * n, num + n

    def cond(passes, done, w, history, last_loss):
      del passes, w, history, last_loss
      return tf.logical_not(done)

    def body(passes, done, w, history, last_loss):
      del done, last_loss
      w, loss_sum, num = sampled.reduce(
          (w, tf.constant(0.0), tf.constant(0.0)), step)
      mean_loss = tf.math.divide_no_nan(loss_sum, num)
      history = tf.concat([history[1:], [mean_loss]], axis=0)
      passes += 1
      converged = tf.logical_and(
          passes > num_pre_loss,
          tf.math.reduce_std(history) < threshold)
      done = tf.logical_or(
          tf.logical_or(tf.logical_not(start_phase), converged),
          passes >= max_start_iterations)
      return passes, done, w, history, mean_loss

    passes, _, learned_w, _, last_loss = tf.while_loop(
        cond, body,
        (tf.constant(0, tf.int32), tf.equal(num_batches, 0), initial_w,
         tf.zeros([num_pre_loss], tf.float32), tf.constant(0.0)))
    learned_w = local_training.select(
        local_training.all_finite(learned_w), learned_w, initial_w)
    weights = aggregate_weights(global_weights, local_weights, learned_w,
                                layer_idx)
    return ALAResult(weights, list(learned_w), passes, last_loss)

  return ala

