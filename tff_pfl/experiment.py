"""One experiment, from a config: data, partition, model, algorithm, run.

`programs/run.py` is a thin absl front end over this module, and the
paper-table programs are grids over it. Everything random derives from
`ExperimentConfig.seed`: the partition, the initial weights (shared by every
algorithm of a comparison), the participation stream, and the per-round,
per-client shuffling and augmentation.
"""

import collections
import dataclasses
import hashlib
import json
import os
import shutil
from typing import Any, Callable, Optional

from absl import logging
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

import keras_models
from tff_pfl.algorithms import registry as algorithms
from tff_pfl.core import checkpoint as checkpoint_lib
from tff_pfl.core import client_state
from tff_pfl.core import loop
from tff_pfl.core import model_spec as model_spec_lib
from tff_pfl.core import process as process_lib
from tff_pfl.core import runtime
from tff_pfl.core import sampling
from tff_pfl.data import client_data as client_data_lib
from tff_pfl.data import partition as partition_lib
from tff_pfl.data import registry as data_registry
from tff_pfl.templates import optimizers

PARTITION_PARAMS = {
    'iid': (),
    'dirichlet': ('alpha', 'min_samples'),
    'disjoint': ('classes_per_client',),
    'shards': ('shards_per_client',),
}
OPTIMIZERS = ('sgd', 'adam')
AUGMENTATIONS = ('none', 'crop_flip', 'crop_flip_normalize', 'normalize')


@dataclasses.dataclass
class ExperimentConfig:
  """Everything that defines a run (saved in summary.json)."""
  dataset: str = 'digits'
  data_dir: Optional[str] = None
  dataset_options: dict[str, Any] = dataclasses.field(default_factory=dict)
  pool_test: bool = True
  partition: str = 'dirichlet'
  partition_params: dict[str, Any] = dataclasses.field(
      default_factory=lambda: {'alpha': 0.5})
  partition_file: Optional[str] = None
  num_clients: int = 10
  clients_per_round: int = 10
  train_fraction: float = 0.75
  val_fraction: float = 0.0
  test_fraction: float = 0.25
  max_train_samples: Optional[int] = None
  model: str = 'mlp'
  model_options: dict[str, Any] = dataclasses.field(default_factory=dict)
  rounds: int = 10
  local_epochs: int = 1
  batch_size: int = 10
  eval_batch_size: int = 256
  optimizer: str = 'sgd'
  learning_rate: float = 0.05
  momentum: float = 0.0
  weight_decay: float = 0.0
  server_learning_rate: float = 1.0
  learning_rate_decay: float = 1.0
  augment: str = 'none'
  eval_every: int = 1
  # Also evaluate each round's sampled clients' models after local training,
  # before aggregation (FedPSD Eq. 10), on their own and the pooled test set.
  local_eval: bool = False
  seed: int = 0
  algorithm_params: dict[str, dict[str, Any]] = dataclasses.field(
      default_factory=dict)
  max_concurrent_clients: Optional[int] = None

  def validate(self) -> None:
    if self.partition not in PARTITION_PARAMS:
      raise ValueError(f'unknown partition {self.partition!r}; known: '
                       f'{sorted(PARTITION_PARAMS)}.')
    unknown = set(self.partition_params) - set(
        PARTITION_PARAMS[self.partition])
    if unknown:
      raise ValueError(
          f'partition {self.partition!r} does not take {sorted(unknown)}; '
          f'it takes {list(PARTITION_PARAMS[self.partition])}.')
    if self.optimizer not in OPTIMIZERS:
      raise ValueError(f'unknown optimizer {self.optimizer!r}; known: '
                       f'{OPTIMIZERS}.')
    if self.augment not in AUGMENTATIONS:
      raise ValueError(f'unknown augmentation {self.augment!r}; known: '
                       f'{AUGMENTATIONS}.')
    if not 1 <= self.clients_per_round <= self.num_clients:
      raise ValueError(
          f'clients_per_round={self.clients_per_round} must be between 1 '
          f'and num_clients={self.num_clients}.')
    for name in ('rounds', 'local_epochs', 'batch_size', 'eval_every',
                 'eval_batch_size'):
      if getattr(self, name) < 1:
        raise ValueError(f'{name} must be >= 1, got {getattr(self, name)}.')
    if self.weight_decay < 0:
      raise ValueError(f'weight_decay must be >= 0, got {self.weight_decay}.')
    if self.learning_rate <= 0:
      raise ValueError(f'learning_rate must be > 0, got {self.learning_rate}.')


@dataclasses.dataclass
class PreparedData:
  """Data, partition, model spec and dataset factory of an experiment."""
  dataset: Any
  partition: partition_lib.Partition
  spec: model_spec_lib.ModelSpec
  client_ids: list[str]
  dataset_fn: loop.DatasetFn
  has_val: bool
  pooled_test_fn: Any = None     # () -> every client's test split together


def _load_partition(config: ExperimentConfig, y: np.ndarray,
                    classification: bool) -> partition_lib.Partition:
  """`config.partition_file`, checked against the data it is used with.

  Same size is not same data: a file made for another data set, sample
  order or pooling would silently give clients other samples. The file's
  labels are compared with the data's labels, or for regression with the
  targets' quantile bins (as many bins as the file records classes).
  """
  path = config.partition_file
  part = partition_lib.Partition.load(path)
  if part.num_samples != len(y):
    raise ValueError(
        f'partition file {path} covers {part.num_samples} samples but '
        f'{config.dataset} has {len(y)} (pool_test={config.pool_test}: the '
        'file may have been made with the test split pooled, or not).')
  if part.num_clients != config.num_clients:
    raise ValueError(
        f'partition file {path} has {part.num_clients} clients, config '
        f'asks for {config.num_clients}.')
  if part.labels is None:
    logging.warning('partition file %s records no labels: it cannot be '
                    'checked against %s.', path, config.dataset)
    return part
  if classification:
    labels, what = y, 'labels'
  else:
    labels = partition_lib.bin_targets(y, num_bins=part.num_classes)
    what = (f'targets (compared by their {part.num_classes} quantile bins, '
            'as the file records)')
  if not np.array_equal(part.labels, labels):
    differ = int(np.count_nonzero(np.asarray(part.labels) != labels))
    raise ValueError(
        f'partition file {path} was made for other {what} than '
        f'{config.dataset} has: {differ} of {len(y)} samples differ. Make '
        'a new partition for this data, or load the data the file was made '
        'for.')
  return part


def prepare(config: ExperimentConfig) -> PreparedData:
  """Loads and partitions the data and builds the model spec."""
  config.validate()
  ds = data_registry.load_dataset(config.dataset, config.data_dir,
                                  **config.dataset_options)
  if config.pool_test or ds.x_test is None:
    x, y = ds.pooled()
  else:
    x, y = ds.x_train, ds.y_train
  classification = ds.task == 'classification'
  if config.partition_file:
    part = _load_partition(config, y, classification)
  else:
    # Regression targets are partitioned by their quantile bins.
    labels = y if classification else partition_lib.bin_targets(y)
    part = partition_lib.make_partition(
        labels, num_clients=config.num_clients, method=config.partition,
        seed=config.seed,
        num_classes=ds.num_classes if classification else None,
        train=config.train_fraction, val=config.val_fraction,
        test=config.test_fraction, max_train_samples=config.max_train_samples,
        **config.partition_params)
  # The partition decides the splits (a file's validation split is used).
  has_val = any(len(i) for i in part.indices('val'))
  splits = {'train': client_data_lib.build_client_data(x, y, part, 'train')}
  splits['test'] = client_data_lib.build_client_data(x, y, part, 'test')
  if has_val:
    splits['val'] = client_data_lib.build_client_data(x, y, part, 'val')

  num_outputs = ds.num_classes if classification else 1
  head = 'linear' if classification else 'regression'
  input_shape = tuple(x.shape[1:])
  # Fail fast on an unknown model or option, in eager mode.
  keras_models.build_model(config.model, input_shape, num_outputs, head=head,
                           encoder_options=config.model_options)

  def keras_model_fn():
    return keras_models.build_model(config.model, input_shape, num_outputs,
                                    head=head,
                                    encoder_options=config.model_options)

  y_spec = tf.TensorSpec([None], tf.int64 if classification else tf.float32)
  spec = model_spec_lib.ModelSpec(
      keras_model_fn=keras_model_fn,
      input_spec=collections.OrderedDict(
          x=tf.TensorSpec((None,) + input_shape, tf.float32), y=y_spec,
          index=tf.TensorSpec([None], tf.int64)),
      task=ds.task, num_outputs=num_outputs)

  augment = None
  if config.augment != 'none' and len(input_shape) != 3:
    raise ValueError(f'augment={config.augment} needs image data, got '
                     f'input shape {input_shape}.')
  if config.augment.startswith('crop_flip'):
    augment = client_data_lib.random_crop_flip(padding=4)
  normalize = None
  if config.augment.endswith('normalize'):
    # Per-channel statistics of all clients' training images, applied to
    # every split (after the crop/flip of training images).
    rows = np.concatenate([np.asarray(i, np.int64)
                           for i in part.indices('train')])
    pixels = x[rows].reshape(-1, input_shape[-1])
    normalize = client_data_lib.normalize(pixels.mean(axis=0),
                                          pixels.std(axis=0) + 1e-6)

  def dataset_fn(client_id: str, round_num: int, split: str):
    base = client_data_lib.with_index(
        splits[split].create_tf_dataset_for_client(client_id))
    if split == 'train':
      batched = client_data_lib.make_batched_dataset(
          base, batch_size=config.batch_size,
          shuffle_seed=loop.derive_seed(config.seed, round_num, client_id),
          augment=augment)
    else:
      batched = base.batch(config.eval_batch_size)
    if normalize is not None:
      batched = batched.map(lambda batch: normalize(batch, None))
    return batched

  def pooled_test_fn():
    pooled = client_data_lib.with_index(
        splits['test'].create_pooled_dataset())
    batched = pooled.batch(config.eval_batch_size)
    if normalize is not None:
      batched = batched.map(lambda batch: normalize(batch, None))
    return batched

  return PreparedData(dataset=ds, partition=part, spec=spec,
                      client_ids=list(part.client_ids), dataset_fn=dataset_fn,
                      has_val=has_val, pooled_test_fn=pooled_test_fn)


def build_optimizer(config: ExperimentConfig):
  """The client optimizer: SGD (momentum) or Adam, with L2 weight decay."""
  if config.optimizer == 'sgd':
    optimizer = tff.learning.optimizers.build_sgdm(
        learning_rate=config.learning_rate,
        momentum=config.momentum or None)
  else:
    optimizer = tff.learning.optimizers.build_adam(
        learning_rate=config.learning_rate)
  return optimizers.with_weight_decay(optimizer, config.weight_decay)


def build_process(config: ExperimentConfig, data: PreparedData,
                  algorithm: str) -> process_lib.PersonalizedProcess:
  """`algorithm`'s process as `config` sets it up (weights from the seed,
  optimizers, epochs, its `algorithm_params`), with the TFF context
  installed."""
  runtime.ensure_context(config.max_concurrent_clients)
  return algorithms.build(
      algorithm, data.spec,
      initial_weights=data.spec.initial_weights(config.seed),
      client_optimizer=build_optimizer(config),
      server_optimizer=tff.learning.optimizers.build_sgdm(
          learning_rate=config.server_learning_rate),
      local_epochs=config.local_epochs,
      learning_rate_decay=config.learning_rate_decay,
      run_context=dict(num_clients=len(data.client_ids),
                       total_rounds=config.rounds),
      **config.algorithm_params.get(algorithm, {}))


def run_algorithm(config: ExperimentConfig, data: PreparedData,
                  algorithm: str, *, store_dir: Optional[str] = None,
                  progress=None, checkpoint_dir: Optional[str] = None,
                  checkpoint_every: int = 5, resume: bool = True,
                  metrics_dir: Optional[str] = None) -> loop.RunResult:
  """Builds `algorithm` and runs it on prepared data.

  Args:
    config: the experiment.
    data: from `prepare(config)`.
    algorithm: a registered algorithm name.
    store_dir: keep client states on disk there (one file per client);
      default in memory.
    progress: per-round callback, see `loop.run`.
    checkpoint_dir: checkpoint there every `checkpoint_every` rounds, and
      resume from the newest checkpoint if `resume` (else start afresh).
    checkpoint_every: rounds between checkpoints.
    resume: continue from an existing checkpoint.
    metrics_dir: release each round's metrics there through
      `tff.program.CSVFileReleaseManager` (rounds.csv) and
      `tff.program.TensorBoardReleaseManager` (tensorboard/).
  """
  process = build_process(config, data, algorithm)
  if store_dir:
    store = client_state.DiskStore(process.initial_client_state, store_dir)
    store.clear()
  else:
    store = client_state.MemoryStore(process.initial_client_state)
  sampler = sampling.ParticipationStream(
      data.client_ids, clients_per_round=config.clients_per_round,
      seed=config.seed)
  checkpoints = None
  if checkpoint_dir:
    if not resume and os.path.isdir(checkpoint_dir):
      shutil.rmtree(checkpoint_dir)
    checkpoints = checkpoint_lib.CheckpointManager(checkpoint_dir)
  managers = []
  if metrics_dir:
    managers = [
        tff.program.CSVFileReleaseManager(
            os.path.join(metrics_dir, 'rounds.csv'),
            key_fieldname='round_key'),
        tff.program.TensorBoardReleaseManager(
            os.path.join(metrics_dir, 'tensorboard')),
    ]
  return loop.run(process, client_ids=data.client_ids,
                  dataset_fn=data.dataset_fn, sampler=sampler,
                  rounds=config.rounds, store=store,
                  eval_every=config.eval_every, has_val=data.has_val,
                  progress=progress, release_managers=managers,
                  checkpoints=checkpoints, checkpoint_every=checkpoint_every,
                  fingerprint=fingerprint(config, algorithm),
                  architecture=data.spec.architecture(),
                  local_eval=config.local_eval,
                  pooled_test=(data.pooled_test_fn() if config.local_eval
                               else None))


def run_into(output_dir: str, config: ExperimentConfig, data: PreparedData,
             algorithm: str, *, label: Optional[str] = None,
             after: Optional[Callable[[loop.RunResult, str], None]] = None,
             **run_kwargs: Any) -> loop.RunResult:
  """Runs `algorithm` with its outputs in `output_dir`, then ends the worker.

  `run_algorithm` with checkpoints in `output_dir/checkpoints` and the
  released metrics in `output_dir/metrics`, then `write_outputs`, then
  `after(result, output_dir)` if given, then `runtime.shutdown()`, also
  when one of these raises: the TFF worker stops and the default context
  is dropped, so the next run starts a fresh worker (one worker keeps
  memory from every computation it ran; BUILD_NOTES, "Worker memory"),
  and `after` is the last place that may call a TFF computation of this
  run.

  Args:
    output_dir: the run's folder.
    config: the experiment.
    data: from `prepare(config)`.
    algorithm: a registered algorithm name.
    label: the `algorithm` written into summary.json (default `algorithm`),
      e.g. a method spec with its hyperparameters.
    after: optional `(result, output_dir) -> None`.
    **run_kwargs: `store_dir`, `progress`, `checkpoint_every`, `resume`, as
      in `run_algorithm`.
  """
  try:
    result = run_algorithm(
        config, data, algorithm,
        checkpoint_dir=os.path.join(output_dir, 'checkpoints'),
        metrics_dir=os.path.join(output_dir, 'metrics'), **run_kwargs)
    write_outputs(output_dir, config, label or algorithm, result,
                  data.partition)
    if after is not None:
      after(result, output_dir)
  finally:
    runtime.shutdown()
  return result


def resume_fields(config: dict[str, Any], algorithm: str) -> dict[str, Any]:
  """The fields of `config` (as `config_to_json` writes it) that must not
  change between a run and its resumption: everything but run-time knobs
  and the number of rounds, which may grow on resumption, except for
  methods whose schedule depends on it (FedPSD's alpha = t / total_rounds).
  Of `algorithm_params` only `algorithm`'s own entry counts (a config
  shared by several algorithms, as `programs.run` builds, may change
  another's).
  """
  fields = dict(config)
  fields['algorithm_params'] = {
      name: params
      for name, params in (config.get('algorithm_params') or {}).items()
      if name == algorithm}
  skip = ['eval_every', 'max_concurrent_clients', 'data_dir', 'local_eval']
  if not (algorithm in algorithms.ALGORITHMS and
          algorithms.uses_run_context(algorithm, 'total_rounds')):
    skip.append('rounds')
  for name in skip:
    fields.pop(name, None)
  return fields


def fingerprint(config: ExperimentConfig, algorithm: str) -> str:
  """`resume_fields` of `config` with `algorithm`, as a short hash."""
  fields = resume_fields(config_to_json(config), algorithm)
  text = json.dumps([algorithm, fields], sort_keys=True)
  return hashlib.sha256(text.encode()).hexdigest()[:16]


def config_to_json(config: ExperimentConfig) -> dict[str, Any]:
  return json.loads(json.dumps(dataclasses.asdict(config), default=str))


def write_outputs(output_dir: str, config: ExperimentConfig, algorithm: str,
                  result: loop.RunResult, partition) -> None:
  """Writes summary.json, rounds.csv and clients.csv into `output_dir`."""
  import pandas as pd  # pylint: disable=g-import-not-at-top
  os.makedirs(output_dir, exist_ok=True)
  summary = collections.OrderedDict(
      algorithm=algorithm, config=config_to_json(config),
      final_round=result.final, best_round_on_val=result.best_val,
      best_round_on_test=result.best_test,
      seconds_per_round=result.seconds_per_round,
      first_round_seconds=result.first_round_seconds,
      model_architecture=result.architecture,
      partition_summary=partition.summary())
  _atomic_write(os.path.join(output_dir, 'summary.json'),
                json.dumps(summary, indent=2))
  _atomic_write(os.path.join(output_dir, 'rounds.csv'),
                pd.DataFrame(result.rounds).to_csv(index=False))
  _atomic_write(os.path.join(output_dir, 'clients.csv'),
                pd.DataFrame(result.clients).to_csv(index=False))


def _atomic_write(path: str, text: str) -> None:
  tmp = path + '.tmp'
  with open(tmp, 'w') as f:
    f.write(text)
  os.replace(tmp, path)
