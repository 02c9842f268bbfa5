"""Algorithm names -> builders, with one common calling convention.

Every builder is called as `build(spec, initial_weights=..., client_optimizer
=..., server_optimizer=..., local_epochs=..., learning_rate_decay=...,
**hparams)`; `hparams` are the algorithm's own hyperparameters (e.g. FedProx
mu), and an unknown one is an error.

Some methods also need facts about the run that are not hyperparameters:
the number of registered clients (SCAFFOLD's server control-variate step)
or the planned number of rounds (FedPSD's alpha = t / t_total). Callers pass
them as `run_context=dict(num_clients=..., total_rounds=...)`, and `build`
hands each builder the entries its signature names, and no others.
"""

from collections.abc import Callable, Collection, Mapping
import dataclasses
import inspect
from typing import Any, Optional

from tff_pfl.algorithms import afedcl
from tff_pfl.algorithms import ditto
from tff_pfl.algorithms import fedala
from tff_pfl.algorithms import fedavg
from tff_pfl.algorithms import fedcurv
from tff_pfl.algorithms import fedlmd
from tff_pfl.algorithms import fednova
from tff_pfl.algorithms import fedntd
from tff_pfl.algorithms import fedper
from tff_pfl.algorithms import fedpsd
from tff_pfl.algorithms import fedprox
from tff_pfl.algorithms import fedrep
from tff_pfl.algorithms import moon
from tff_pfl.algorithms import nofl
from tff_pfl.algorithms import scaffold
from tff_pfl.core import process as process_lib


@dataclasses.dataclass(frozen=True)
class AlgorithmInfo:
  name: str
  build: Callable[..., process_lib.PersonalizedProcess]
  description: str
  uses_server_optimizer: bool = True
  # Whether clients report their model after local training
  # (`ClientOutput.local_model`, FedPSD's Eq. 10); checked against the built
  # process by tests, so programs can refuse `local_eval` before any run.
  reports_local_models: bool = True
  # Whether the builder refuses a regression spec (the method distils or
  # calibrates class probabilities); checked against the builders by
  # tests, so programs can refuse a regression data set before any run.
  classification_only: bool = False


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
        'aggregation, adaptive fusion; lambda_, dcc, caa, aff',
        reports_local_models=False),
    'fedpsd': AlgorithmInfo(
        'fedpsd', fedpsd.build_fedpsd,
        'FedPSD (fedpsd.txt): calibrated CE + progressive self-distillation '
        'with stored predictions; rhpk, psd, cll',
        classification_only=True),
    'moon': AlgorithmInfo(
        'moon', moon.build_moon,
        'MOON (Li et al. 2021): model-contrastive term on encoder outputs '
        '(global vs previous local model); mu, temperature'),
    'fedntd': AlgorithmInfo(
        'fedntd', fedntd.build_fedntd,
        'FedNTD (Lee et al. 2022): not-true distillation from the global '
        'model; beta, temperature',
        classification_only=True),
    'fedlmd': AlgorithmInfo(
        'fedlmd', fedlmd.build_fedlmd,
        'FedLMD (Lu et al. 2023): distillation with the client\'s major '
        'labels masked out of the teacher; beta, temperature',
        classification_only=True),
    'scaffold': AlgorithmInfo(
        'scaffold', scaffold.build_scaffold,
        'SCAFFOLD (Karimireddy et al. 2020), option II control variates; '
        'momentum (= client momentum); needs run_context num_clients'),
    'fednova': AlgorithmInfo(
        'fednova', fednova.build_fednova,
        'FedNova (Wang et al. 2020): step-normalized averaging; momentum '
        '(= client momentum)'),
    'fedcurv': AlgorithmInfo(
        'fedcurv', fedcurv.build_fedcurv,
        'FedCurv (Shoham et al. 2019): Fisher-weighted penalty towards other '
        'clients; lambda_, fisher_samples'),
    'nofl': AlgorithmInfo(
        'nofl', nofl.build_nofl,
        'No-FL: each client trains only on its own data',
        uses_server_optimizer=False),
}

_COMMON = ('initial_weights', 'client_optimizer', 'server_optimizer',
           'local_epochs', 'learning_rate_decay')


def list_algorithms() -> list[tuple[str, str]]:
  return [(a.name, a.description) for a in ALGORITHMS.values()]


RUN_CONTEXT = ('num_clients', 'total_rounds')


def uses_run_context(name: str, key: str) -> bool:
  """Whether algorithm `name` takes run-context entry `key`."""
  if key not in RUN_CONTEXT:
    raise ValueError(f'unknown run_context entry {key!r}; known: '
                     f'{RUN_CONTEXT}.')
  return key in inspect.signature(ALGORITHMS[name].build).parameters


def _check_names(name: str, keys: Collection[str]) -> None:
  """Raises ValueError for an unknown algorithm or keyword of its builder."""
  if name not in ALGORITHMS:
    raise ValueError(f'unknown algorithm {name!r}; known: '
                     f'{sorted(ALGORITHMS)}.')
  params = inspect.signature(ALGORITHMS[name].build).parameters
  unknown = sorted(k for k in keys if k not in params or k in RUN_CONTEXT)
  if unknown:
    accepted = sorted(k for k in params
                      if k not in ('spec',) and k not in RUN_CONTEXT)
    raise ValueError(f'{name} does not take {unknown}; it accepts '
                     f'{accepted}.')


def check(name: str, hparams: Mapping[str, Any],
          task: Optional[str] = None) -> None:
  """Checks, without building anything, that algorithm `name` exists, takes
  every key of `hparams` and supports `task` ('classification' or
  'regression'; None: not checked): programs call it for every algorithm
  of a run before the first one trains.

  Raises:
    ValueError: naming the unknown algorithm or hyperparameters, or the
      task the algorithm does not support.
  """
  _check_names(name, hparams)
  if (task is not None and task != 'classification'
      and ALGORITHMS[name].classification_only):
    raise ValueError(f'{name} needs a classification task (it works on '
                     f'class probabilities), got {task!r}.')


def build(name: str, spec, *, run_context: Optional[Mapping[str, Any]] = None,
          **kwargs: Any) -> process_lib.PersonalizedProcess:
  """Builds algorithm `name`; see the module docstring."""
  if name in ALGORITHMS and not ALGORITHMS[name].uses_server_optimizer:
    kwargs.pop('server_optimizer', None)
  _check_names(name, kwargs)
  info = ALGORITHMS[name]
  params = inspect.signature(info.build).parameters
  for key, value in (run_context or {}).items():
    if key not in RUN_CONTEXT:
      raise ValueError(f'unknown run_context entry {key!r}; known: '
                       f'{RUN_CONTEXT}.')
    if key in params:
      kwargs[key] = value
  return info.build(spec, **kwargs)
