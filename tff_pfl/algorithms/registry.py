"""Algorithm names -> builders, with one common calling convention.

Every builder is called as `build(spec, initial_weights=..., client_optimizer
=..., server_optimizer=..., local_epochs=..., learning_rate_decay=...,
**hparams)`; `hparams` are the algorithm's own hyperparameters (e.g. FedProx
mu), and an unknown one is an error.
"""

from collections.abc import Callable, Mapping
import dataclasses
import inspect
from typing import Any

from tff_pfl.algorithms import afedcl
from tff_pfl.algorithms import ditto
from tff_pfl.algorithms import fedala
from tff_pfl.algorithms import fedavg
from tff_pfl.algorithms import fedper
from tff_pfl.algorithms import fedprox
from tff_pfl.algorithms import fedrep
from tff_pfl.algorithms import nofl
from tff_pfl.core import process as process_lib


@dataclasses.dataclass(frozen=True)
class AlgorithmInfo:
  name: str
  build: Callable[..., process_lib.PersonalizedProcess]
  description: str
  uses_server_optimizer: bool = True



ALGORITHMS: Mapping[str, AlgorithmInfo] = {
    'fedavg': AlgorithmInfo(
        'fedavg', fedavg.build_fedavg,
        'FedAvg (McMahan et al. 2017); global model evaluated per client'),
    'fedprox': AlgorithmInfo(
        'fedprox', fedprox.build_fedprox,
        'FedProx (Li et al. 2020), correct-sign proximal term; mu'),
    'fedper': AlgorithmInfo(
        'fedper', fedper.build_fedper,
        'FedPer (Arivazhagan et al. 2019): shared body, personal head'),
    'fedrep': AlgorithmInfo(
        'fedrep', fedrep.build_fedrep,
        'FedRep (Collins et al. 2021): head epochs then body; head_epochs'),
    'ditto': AlgorithmInfo(
        'ditto', ditto.build_ditto,
        'Ditto (Li et al. 2021): global + proximal personal model; lambda_, '
        'personal_epochs'),
    'fedala': AlgorithmInfo(
        'fedala', fedala.build_fedala,
        'FedALA (Zhang et al. 2023): adaptive local aggregation; eta, '
        'rand_percent, layer_idx, threshold'),
    'afedcl': AlgorithmInfo(
        'afedcl', afedcl.build_afedcl,
        'AFedCL (afedcl.txt): adversarial consensus, L_D-weighted '
        'aggregation, adaptive fusion; lambda_, dcc, caa, aff'),
    'nofl': AlgorithmInfo(
        'nofl', nofl.build_nofl,
        'No-FL: each client trains only on its own data',
        uses_server_optimizer=False),
}

_COMMON = ('initial_weights', 'client_optimizer', 'server_optimizer',
           'local_epochs', 'learning_rate_decay')


def list_algorithms() -> list[tuple[str, str]]:
  return [(a.name, a.description) for a in ALGORITHMS.values()]


def build(name: str, spec, **kwargs: Any) -> process_lib.PersonalizedProcess:
  """Builds algorithm `name`; see the module docstring."""
  if name not in ALGORITHMS:
    raise ValueError(f'unknown algorithm {name!r}; known: '
                     f'{sorted(ALGORITHMS)}.')
  info = ALGORITHMS[name]
  if not info.uses_server_optimizer:
    kwargs.pop('server_optimizer', None)
  params = inspect.signature(info.build).parameters
  unknown = sorted(k for k in kwargs if k not in params)
  if unknown:
    accepted = sorted(k for k in params if k not in ('spec',))
    raise ValueError(f'{name} does not take {unknown}; it accepts '
                     f'{accepted}.')
  return info.build(spec, **kwargs)
