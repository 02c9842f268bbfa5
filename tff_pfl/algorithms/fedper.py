"""FedPer (Arivazhagan et al., 2019): shared base layers, personal head.

The model is split into base (encoder) layers W_B, shared and averaged like
FedAvg, and personalization layers W_P (the classifier head), which each
client keeps. In round t client k starts from (W_B^t, W_P^k), trains both
with E local epochs of SGD, uploads W_B only and keeps its new W_P^k.
Client k is evaluated with (W_B, W_P^k). See `templates.personal_head`.

`local_statistics=True` keeps each client's BatchNorm moving statistics
local, as PFLlib's FedPer does; the default averages them with the body
(TFF's treatment of non-trainable weights).
"""

from typing import Optional

import tensorflow_federated as tff

from tff_pfl.core import model_spec as model_spec_lib
from tff_pfl.core import process as process_lib
from tff_pfl.templates import client_works
from tff_pfl.templates import personal_head


def build_fedper(
    spec: model_spec_lib.ModelSpec,
    *,
    initial_weights: tff.learning.models.ModelWeights,
    client_optimizer: tff.learning.optimizers.Optimizer,
    server_optimizer: Optional[tff.learning.optimizers.Optimizer] = None,
    local_epochs: int = 1,
    learning_rate_decay: float = 1.0,
    local_statistics: bool = False,
) -> process_lib.PersonalizedProcess:
  """Builds FedPer. Arguments as in `fedavg.build_fedavg`; see above."""
  train_fn = client_works.build_local_update(
      spec, client_optimizer, epochs=local_epochs,
      learning_rate_decay=learning_rate_decay)
  work = personal_head.build_personal_head_client_work(
      spec, initial_weights, train_fn, local_statistics=local_statistics)
  return process_lib.compose_with_global_model(
      spec, initial_weights, work, server_optimizer=server_optimizer,
      name='fedper')
