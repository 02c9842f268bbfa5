"""The proximal term mu/2 * ||w - w_anchor||^2 (FedProx Eq. 2, Ditto Eq. 3).

Its gradient with respect to w is `mu * (w - w_anchor)`, which pulls the
trained weights towards the anchor (the global model). TFF 0.87's
`build_weighted_fed_prox` adds `mu * (w_anchor - w)` instead (the sign is
reversed, so a larger mu pushes clients away; see BUILD_NOTES.md), which is
why FedProx and Ditto use this term.
"""

from collections.abc import Sequence

import tensorflow as tf


def build_proximal_loss(mu: float, anchor_trainable: Sequence[tf.Tensor],
                        variables_fn=None):
  """An `ExtraLossFn` adding mu/2 * sum ||v - anchor||^2.

  Args:
    mu: proximal strength, >= 0.
    anchor_trainable: anchor tensors, one per trainable variable.
    variables_fn: `model -> variables` to penalise; default all trainable.
  """
  if mu < 0:
    raise ValueError(f'proximal strength must be >= 0, got {mu}.')

  def extra_loss(model, batch, outputs):
    del batch, outputs
    variables = (model.trainable_variables if variables_fn is None
                 else variables_fn(model))
    terms = [tf.reduce_sum(tf.square(v - tf.cast(a, v.dtype)))
             for v, a in zip(variables, anchor_trainable)]
    return 0.5 * mu * tf.add_n(terms)

  return extra_loss


def proximal_factory(mu: float):
  """`anchor_weights -> ExtraLossFn`, for `client_works.build_local_update`."""
  if mu < 0:
    raise ValueError(f'proximal strength must be >= 0, got {mu}.')
  return lambda anchor: build_proximal_loss(mu, list(anchor.trainable))
