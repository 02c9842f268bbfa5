"""FedRep (Collins et al., ICML 2021): shared representation, local heads.

Client k, from the global representation phi^t and its head h^k:
  1. head update: `head_epochs` epochs of SGD on h^k with phi^t frozen;
  2. representation update: `local_epochs` epochs on phi with the new h^k
     frozen (FedRep Algorithm 1, lines 6-13);
and uploads phi only; the server averages the representations. Client k is
evaluated with (phi, h^k).

Default `head_epochs=1`: PFLlib's FedRep default (`plocal_epochs`), the
protocol of the FedALA comparison; the FedRep paper itself uses 10.
`local_statistics=True` keeps each client's BatchNorm moving statistics
local, as PFLlib's FedRep does; the default averages them with phi.
"""

from typing import Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_pfl.core import model_spec as model_spec_lib
from tff_pfl.core import process as process_lib
from tff_pfl.templates import client_works
from tff_pfl.templates import personal_head


def build_fedrep(
    spec: model_spec_lib.ModelSpec,
    *,
    initial_weights: tff.learning.models.ModelWeights,
    client_optimizer: tff.learning.optimizers.Optimizer,
    server_optimizer: Optional[tff.learning.optimizers.Optimizer] = None,
    local_epochs: int = 1,
    learning_rate_decay: float = 1.0,
    head_epochs: int = 1,
    local_statistics: bool = False,
) -> process_lib.PersonalizedProcess:
  """Builds FedRep; `head_epochs` epochs on the head, then the body."""
  if head_epochs < 1:
    raise ValueError(f'FedRep head_epochs must be >= 1, got {head_epochs}.')
  num_head = spec.num_head_variables()
  train_head = client_works.build_local_update(
      spec, client_optimizer, epochs=head_epochs,
      learning_rate_decay=learning_rate_decay,
      trainable_slice=slice(-num_head, None))
  train_body = client_works.build_local_update(
      spec, client_optimizer, epochs=local_epochs,
      learning_rate_decay=learning_rate_decay,
      trainable_slice=slice(0, -num_head))

  @tf.function
  def train_fn(model, start, dataset, round_num):
    head = train_head(model, start, dataset, round_num)
    body = train_body(model, head.weights, dataset, round_num)
    metrics = body.metrics.copy()
    metrics['non_finite'] = tf.maximum(head.metrics['non_finite'],
                                       body.metrics['non_finite'])
    return client_works.LocalResult(
        body.weights, metrics, tf.logical_and(head.finite, body.finite),
        head.num_steps + body.num_steps)

  work = personal_head.build_personal_head_client_work(
      spec, initial_weights, train_fn, local_statistics=local_statistics)
  return process_lib.compose_with_global_model(
      spec, initial_weights, work, server_optimizer=server_optimizer,
      name='fedrep')
