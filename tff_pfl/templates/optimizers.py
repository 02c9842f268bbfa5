"""Client optimizers beyond TFF's: SGD with momentum and L2 weight decay.

TFF 0.87's `build_sgdm` has no weight decay, while the FedPSD paper (Section
V-C) trains with SGD, momentum 0.9 and weight decay 1e-5 (as PyTorch's
`SGD(weight_decay=...)`: the gradient becomes g + wd * w before the momentum
step). `with_weight_decay` wraps any `tff.learning.optimizers.Optimizer`
that way; its state and hyperparameters (learning rate, momentum) are the
wrapped optimizer's, so per-round learning-rate decay keeps working.
"""

from typing import Any

import tensorflow as tf
import tensorflow_federated as tff


class _WeightDecay(tff.learning.optimizers.Optimizer):
  """Adds `weight_decay * w` to every gradient, then defers to `inner`."""

  def __init__(self, inner: tff.learning.optimizers.Optimizer,
               weight_decay: float):
    self._inner = inner
    self._weight_decay = float(weight_decay)

  def initialize(self, specs: Any) -> Any:
    return self._inner.initialize(specs)

  def next(self, state: Any, weights: Any, gradients: Any) -> tuple[Any, Any]:
    decayed = tf.nest.map_structure(
        lambda g, w: g + tf.cast(self._weight_decay, g.dtype) * w,
        gradients, weights)
    return self._inner.next(state, weights, decayed)

  def get_hparams(self, state: Any) -> Any:
    return self._inner.get_hparams(state)

  def set_hparams(self, state: Any, hparams: Any) -> Any:
    return self._inner.set_hparams(state, hparams)


def with_weight_decay(
    optimizer: tff.learning.optimizers.Optimizer,
    weight_decay: float) -> tff.learning.optimizers.Optimizer:
  """`optimizer` with coupled L2 weight decay; 0 returns it unchanged."""
  if weight_decay < 0:
    raise ValueError(f'weight_decay must be >= 0, got {weight_decay}.')
  if weight_decay == 0:
    return optimizer
  return _WeightDecay(optimizer, weight_decay)
