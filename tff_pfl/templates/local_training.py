"""The one local-training loop every algorithm's client work runs.

`train_model` runs `epochs` passes of mini-batch optimisation over a client
dataset with a `tff.learning.optimizers.Optimizer`, minimising the model's
task loss plus an optional extra term (a proximal pull, a distillation or
adversarial loss, ...) supplied by the algorithm. It is TensorFlow code meant
to run inside a `tff.tensorflow.computation`; the loop is
`dataset.reduce`-based (TFF's DATASET_REDUCE), which does not depend on
AutoGraph converting a Python `for` over a dataset (field guide pitfall 9).

Keras BatchNormalization layers are called with `training=True`, so their
moving statistics are updated during local training like any Keras fit; what
happens to them afterwards (averaged at the server, or kept per client) is
the algorithm's choice.
"""

import collections
from collections.abc import Callable, Sequence
from typing import Any, Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_pfl.core import model_spec as model_spec_lib

# extra_loss_fn(model, batch, outputs) -> scalar added to the task loss.
ExtraLossFn = Callable[[tf.keras.Model, Any, tf.Tensor], tf.Tensor]
# forward_fn(batch) -> (outputs, extra loss scalar), or with a carry
# forward_fn(batch, carry) -> (outputs, extra loss scalar, new carry).
ForwardFn = Callable[..., tuple]
# task_loss_fn(y_true, outputs) -> mean batch loss, replacing spec.loss.
TaskLossFn = Callable[[tf.Tensor, tf.Tensor], tf.Tensor]


def train_model(
    spec: model_spec_lib.ModelSpec,
    model: tf.keras.Model,
    optimizer: tff.learning.optimizers.Optimizer,
    dataset: tf.data.Dataset,
    epochs: int,
    *,
    variables: Optional[Sequence[tf.Variable]] = None,
    extra_loss_fn: Optional[ExtraLossFn] = None,
    learning_rate: Optional[tf.Tensor] = None,
    forward_fn: Optional[ForwardFn] = None,
    task_loss_fn: Optional[TaskLossFn] = None,
    carry: Any = None,
    epoch_end_fn: Optional[Callable[[Any], Any]] = None,
) -> collections.OrderedDict:
  """Trains `variables` of `model` in place; returns loss and example sums.

  Args:
    spec: the model's spec (provides the task loss).
    model: a Keras model whose variables already hold the starting weights.
    optimizer: a TFF optimizer; its state is created fresh for this call.
    dataset: batched `OrderedDict(x=, y=)` elements.
    epochs: number of passes over `dataset` (a Python int or int tensor).
    variables: which variables to train; default all trainable ones.
    extra_loss_fn: optional extra loss term, see `ExtraLossFn`.
    learning_rate: optional scalar that overrides the optimizer's learning
      rate hyperparameter for this call (used for per-round decay).
    forward_fn: optional `batch -> (outputs, extra_loss)` replacing
      `model(batch['x'])` and `extra_loss_fn`, for methods whose forward pass
      is not the spec's model alone (e.g. AFedCL's discriminator or fused
      features); `variables` must then be given.
    task_loss_fn: optional `(y_true, outputs) -> mean loss` replacing
      `spec.loss` (e.g. FedPSD's logit-calibrated cross-entropy).
    carry: optional nested tensors threaded through every step and epoch
      (e.g. FedPSD's per-sample prediction buffers). With a carry,
      `forward_fn(batch, carry)` returns `(outputs, extra, new_carry)`.
    epoch_end_fn: optional `carry -> carry` applied after every epoch (e.g.
      the previous epoch's predictions become the next epoch's teacher).

  Returns:
    `OrderedDict(loss_sum, extra_sum, num_examples, num_steps)` (float32)
    summed over every batch of every epoch, weighted by batch size: the task
    loss and the extra loss term, the examples seen and the optimizer steps
    taken (batches x epochs); plus `carry`, its final value, when one was
    given.
  """
  if carry is not None and forward_fn is None:
    raise ValueError('train_model with a carry needs a forward_fn that '
                     'takes and returns it.')
  if epoch_end_fn is not None and carry is None:
    raise ValueError('epoch_end_fn needs a carry.')
  task_loss_fn = task_loss_fn or spec.loss
  if variables is None:
    if forward_fn is not None:
      raise ValueError('train_model with forward_fn needs variables.')
    variables = model.trainable_variables
  variables = list(variables)
  specs = tuple(tf.TensorSpec(v.shape, v.dtype) for v in variables)
  opt_state = optimizer.initialize(specs)
  if learning_rate is not None:
    hparams = optimizer.get_hparams(opt_state)
    hparams['learning_rate'] = tf.cast(learning_rate, tf.float32)
    opt_state = optimizer.set_hparams(opt_state, hparams)

  def step(state, batch):
    opt_state, loss_sum, extra_sum, num, steps, step_carry = state
    with tf.GradientTape() as tape:
      if carry is not None:
        outputs, extra, step_carry = forward_fn(batch, step_carry)
      elif forward_fn is not None:
        outputs, extra = forward_fn(batch)
      else:
        outputs = model(batch['x'], training=True)
        extra = (extra_loss_fn(model, batch, outputs) if extra_loss_fn
                 else tf.constant(0.0))
      task_loss = task_loss_fn(batch['y'], outputs)
      loss = task_loss + extra
      if model is not None and model.losses:
        loss += tf.add_n(model.losses)
    grads = tape.gradient(loss, variables)
    grads = [tf.zeros_like(v) if g is None else g
             for v, g in zip(variables, grads)]
    opt_state, new_weights = optimizer.next(
        opt_state, tuple(tf.identity(v) for v in variables), tuple(grads))
    for v, w in zip(variables, new_weights):
      v.assign(w)
    n = tf.cast(tf.shape(batch['y'])[0], tf.float32)
    return (opt_state, loss_sum + task_loss * n, extra_sum + extra * n,
            num + n, steps + 1.0, step_carry)

  # An explicit while_loop (not `for _ in tf.range`) so that correctness
  # never depends on AutoGraph converting this function.
  def epoch(i, state):
    state = dataset.reduce(state, step)
    if epoch_end_fn is not None:
      state = state[:5] + (epoch_end_fn(state[5]),)
    return i + 1, state

  initial_carry = () if carry is None else carry
  state = (opt_state, tf.constant(0.0), tf.constant(0.0), tf.constant(0.0),
           tf.constant(0.0), initial_carry)
  _, state = tf.while_loop(lambda i, _: i < tf.cast(epochs, tf.int32), epoch,
                           (tf.constant(0), state))
  result = collections.OrderedDict(loss_sum=state[1], extra_sum=state[2],
                                   num_examples=state[3], num_steps=state[4])
  if carry is not None:
    result['carry'] = state[5]
  return result


def all_finite(structure: Any) -> tf.Tensor:
  """True when every float tensor in `structure` is finite."""
  checks = [tf.reduce_all(tf.math.is_finite(t))
            for t in tf.nest.flatten(structure) if t.dtype.is_floating]
  if not checks:
    return tf.constant(True)
  return tf.reduce_all(tf.stack(checks))


def select(condition: tf.Tensor, if_true: Any, if_false: Any) -> Any:
  """Structure-wise `tf.where` on a scalar condition."""
  return tf.nest.map_structure(
      lambda a, b: tf.where(condition, a, b), if_true, if_false)
