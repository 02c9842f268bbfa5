"""FedProx (Li et al., MLSys 2020) with a correct proximal term.

Client k minimises h_k(w; w_t) = F_k(w) + mu/2 ||w - w_t||^2 (FedProx Eq. 2)
from the global weights w_t; the server aggregates as FedAvg. The proximal
gradient mu (w - w_t) pulls local models towards w_t, so a larger mu keeps
them closer (tested). We do not use TFF 0.87's `build_weighted_fed_prox`,
whose proximal term has the opposite sign (BUILD_NOTES.md). mu = 0 is FedAvg.

Default mu = 0.01: the FedProx paper tunes mu over {0.001, 0.01, 0.1, 0.5,
1}; PFLlib's default mu = 0 would silently turn FedProx into FedAvg.
"""

from typing import Optional

import tensorflow_federated as tff

from tff_pfl.algorithms import fedavg
from tff_pfl.core import model_spec as model_spec_lib
from tff_pfl.core import process as process_lib
from tff_pfl.templates import proximal


def build_fedprox(
    spec: model_spec_lib.ModelSpec,
    *,
    initial_weights: tff.learning.models.ModelWeights,
    client_optimizer: tff.learning.optimizers.Optimizer,
    server_optimizer: Optional[tff.learning.optimizers.Optimizer] = None,
    local_epochs: int = 1,
    learning_rate_decay: float = 1.0,
    mu: float = 0.01,
) -> process_lib.PersonalizedProcess:
  """Builds FedProx; `mu` is the proximal strength, other args as FedAvg."""
  if mu < 0:
    raise ValueError(f'FedProx mu must be >= 0, got {mu}.')
  work = fedavg.build_fedavg_client_work(
      spec, client_optimizer, local_epochs=local_epochs,
      learning_rate_decay=learning_rate_decay,
      extra_loss_fn=proximal.proximal_factory(mu))
  return process_lib.compose_with_global_model(
      spec, initial_weights, work, server_optimizer=server_optimizer,
      name='fedprox')
