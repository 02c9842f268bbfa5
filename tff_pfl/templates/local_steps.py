"""Counting local steps, and their momentum-adjusted count.

SCAFFOLD's option-II control variate divides the model change by K * lr
(K local steps) and FedNova normalizes each client's change by a_i, its
number of local steps adjusted for momentum. With heavy-ball momentum rho
(TFF's `build_sgdm`, like PyTorch's SGD: m <- rho m + g, w <- w - lr m) and
a constant gradient g, tau steps move the weights by lr * a(tau, rho) * g,

    a(tau, rho) = [tau - rho (1 - rho^tau) / (1 - rho)] / (1 - rho)

(FedNova, Wang et al. 2020, for SGD with momentum; the FedNTD code base
uses the same a for FedNova and, as "adaptive division", for SCAFFOLD).
rho = 0 gives a = tau.

The local steps tau are counted by the one training loop
(`local_training.train_model`'s `num_steps`: batches x epochs).
"""

from typing import Any, Optional

import tensorflow as tf
import tensorflow_federated as tff


def effective_steps(steps: Any, momentum: float) -> Any:
  """a(tau, rho) of the module docstring; `steps` may be a tensor."""
  if momentum == 0.0:
    return steps
  rho = tf.constant(momentum, tf.float32)
  return (steps - rho * (1.0 - tf.pow(rho, steps)) / (1.0 - rho)) / (1.0 - rho)


def check_momentum(optimizer: tff.learning.optimizers.Optimizer,
                   initial_weights: Any, momentum: Optional[float],
                   algorithm: str) -> float:
  """A method's `momentum`, read off the client optimizer or validated.

  The client optimizer's momentum is its `momentum` hyperparameter (TFF's
  `build_sgdm` exposes it when it is > 0); an optimizer without one counts
  as 0. `momentum=None` takes that value; a given value that differs is a
  ValueError, since the normalization would then be wrong by up to a
  factor 1 / (1 - rho).

  Returns:
    the momentum as a float.
  """
  specs = tuple(tf.TensorSpec(w.shape, w.dtype)
                for w in initial_weights.trainable)
  hparams = optimizer.get_hparams(optimizer.initialize(specs))
  actual = float(hparams.get('momentum', 0.0))
  if momentum is None:
    momentum = actual
  momentum = float(momentum)
  if not 0.0 <= momentum < 1.0:
    raise ValueError(f'{algorithm} momentum must be in [0, 1), got '
                     f'{momentum}.')
  if abs(actual - momentum) > 1e-6:
    raise ValueError(
        f'{algorithm} momentum={momentum} does not match the client '
        f"optimizer's momentum {actual}: pass momentum={actual}.")
  return momentum
