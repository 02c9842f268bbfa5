r"""Runs one or more algorithms on one partitioned data set as TFF simulations.

Example (the README demo, embedded data, no files needed):

  python -m programs.run --algorithm=fedavg,nofl --dataset=digits \
    --partition=dirichlet --alpha=0.3 --num_clients=10 --rounds=10 \
    --model=mlp --output_dir=/tmp/demo

With one algorithm, DIR gets summary.json, rounds.csv, clients.csv and
partition.json; with several, each algorithm gets DIR/<algorithm>/ and DIR
gets comparison.md. All algorithms of one call share the partition, the
initial weights and the participation stream (all derived from --seed).
`--list` prints the algorithms, data sets, partitions and models.
"""

import collections
import os
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
import json
import sys
import time
from typing import Any, Mapping, NamedTuple

from absl import app
from absl import flags
# Import TensorFlow and Keras before `app.run`: when TensorFlow is first
# imported inside an absl main, building a Keras functional model fails with
# "'SymbolicTensor' object has no attribute 'node'" (seen with TF 2.14.1).
import tensorflow as tf  # pylint: disable=unused-import
from tqdm import tqdm

import keras_models
from programs import grid
from tff_pfl import experiment
from tff_pfl.algorithms import registry as algorithms
from tff_pfl.core import checkpoint
from tff_pfl.data import registry as data_registry

FLAGS = flags.FLAGS
flags.DEFINE_bool('list', False, 'Print algorithms, data sets, partitions and '
                  'models, then exit.')
flags.DEFINE_list('algorithm', ['fedavg'], 'Comma-separated algorithm names.')
flags.DEFINE_string('dataset', 'digits', 'Data set name (see --list).')
flags.DEFINE_string('data_dir', None, 'Folder with the data files (default: '
                    '$TFF_PFL_DATA_DIR or ../shared/data).')
flags.DEFINE_integer('image_size', None, 'Resize images of image-folder data '
                     'sets (neu_cls, cifar10) to this side length.')
flags.DEFINE_bool('pool_test', True, "Pool the data set's own test split "
                  'with its training split before partitioning (the PFLlib '
                  'protocol); otherwise only the training split is used.')
flags.DEFINE_enum('partition', 'dirichlet',
                  ['iid', 'dirichlet', 'disjoint', 'shards'],
                  'Partition scheme.')
flags.DEFINE_float('alpha', 0.5, 'Dirichlet concentration (dirichlet).')
flags.DEFINE_integer('min_samples', None, 'Minimum samples per client '
                     '(dirichlet).')
flags.DEFINE_integer('classes_per_client', 2, 'Classes per client '
                     '(disjoint).')
flags.DEFINE_integer('shards_per_client', 2, 'Shards per client (shards).')
flags.DEFINE_string('partition_file', None, 'Load this saved partition JSON '
                    'instead of partitioning.')
flags.DEFINE_integer('num_clients', 10, 'Number of clients.')
flags.DEFINE_integer('clients_per_round', None, 'Clients sampled per round '
                     '(default: all).')
flags.DEFINE_float('participation_rate', None, 'Fraction of clients sampled '
                   'per round, e.g. 0.1 (alternative to --clients_per_round).')
flags.DEFINE_float('train_fraction', 0.75, 'Per-client training fraction.')
flags.DEFINE_float('val_fraction', 0.0, 'Per-client validation fraction.')
flags.DEFINE_float('test_fraction', 0.25, 'Per-client test fraction.')
flags.DEFINE_integer('max_train_samples', None, 'Cap of training samples per '
                     'client (k-shot).')
flags.DEFINE_string('model', 'mlp', 'Encoder name (see --list); a linear '
                    '(or regression) head is added.')
flags.DEFINE_string('model_options', '{}', 'JSON dict of encoder options, '
                    'e.g. {"alpha": 0.35}.')
flags.DEFINE_integer('rounds', 10, 'Communication rounds.')
flags.DEFINE_integer('local_epochs', 1, 'Local epochs per round.')
flags.DEFINE_integer('batch_size', 10, 'Training batch size.')
flags.DEFINE_integer('eval_every', 1, 'Evaluate all clients every N rounds.')
flags.DEFINE_bool('local_eval', False, 'Also evaluate each evaluation '
                  'round\'s sampled clients\' models after local training, '
                  'before aggregation (FedPSD Eq. 10), on their own and on '
                  'the pooled test set (local/..., local_pooled/...).')
flags.DEFINE_enum('optimizer', 'sgd', ['sgd', 'adam'], 'Client optimizer.')
flags.DEFINE_float('learning_rate', 0.05, 'Client learning rate.')
flags.DEFINE_float('momentum', 0.0, 'Client SGD momentum.')
flags.DEFINE_float('server_learning_rate', 1.0, 'Server SGD learning rate.')
flags.DEFINE_float('learning_rate_decay', 1.0, 'Per-round client learning '
                   'rate decay factor.')
flags.DEFINE_enum('augment', 'none', list(experiment.AUGMENTATIONS),
                  'crop_flip: random crop (pad 4) and horizontal flip of '
                  'training images; crop_flip_normalize also standardizes '
                  'every split with per-channel training statistics.')
flags.DEFINE_float('weight_decay', 0.0, 'Client L2 weight decay (added to '
                   'the gradient, as PyTorch SGD).')
flags.DEFINE_string('algorithm_params', '{}', 'JSON dict algorithm -> dict '
                    'of its hyperparameters, e.g. {"fedprox": {"mu": 0.01}}.')
flags.DEFINE_integer('seed', 0, 'The one seed everything derives from.')
flags.DEFINE_string('output_dir', None, 'Where results are written.')
flags.DEFINE_bool('progress', True, 'Show a progress bar.')
flags.DEFINE_integer('checkpoint_every', 5, 'Checkpoint every N rounds (in '
                     'DIR[/<algorithm>]/checkpoints).')
flags.DEFINE_bool('resume', True, 'Resume from the newest checkpoint if one '
                  'exists; --noresume starts afresh.')
flags.DEFINE_enum('client_store', 'memory', ['memory', 'disk'], 'Keep client '
                  'states in memory or one file per client on disk.')
flags.DEFINE_integer('max_concurrent_clients', None, 'Cap on concurrently '
                     'trained clients in the TFF worker (memory); results '
                     'are unaffected.', lower_bound=1)


def _print_list() -> None:
  print('Algorithms:')
  for name, desc in algorithms.list_algorithms():
    print(f'  {name:16s} {desc}')
  print('Data sets:')
  for name, desc, needs_file in data_registry.list_datasets():
    print(f'  {name:16s} {desc}' + ('' if needs_file else ' [embedded]'))
  print('Partitions:')
  for name, params in experiment.PARTITION_PARAMS.items():
    print(f'  {name:16s} params: {", ".join(params) or "-"}')
  print('Models:')
  for name, kind, desc in keras_models.describe():
    print(f'  {name:16s} [{kind}] {desc}')


def _clients_per_round() -> int:
  if FLAGS.participation_rate is not None:
    if FLAGS.clients_per_round is not None:
      raise app.UsageError('give --clients_per_round or --participation_rate,'
                           ' not both.')
    if not 0.0 < FLAGS.participation_rate <= 1.0:
      raise app.UsageError('--participation_rate must be in (0, 1], got '
                           f'{FLAGS.participation_rate}.')
    return max(1, int(round(FLAGS.participation_rate * FLAGS.num_clients)))
  if FLAGS.clients_per_round is not None:
    return FLAGS.clients_per_round      # checked against --num_clients
  return FLAGS.num_clients


# Flags that define the partition; a --partition_file replaces them all.
_PARTITION_FLAGS = ('partition', 'alpha', 'min_samples', 'classes_per_client',
                    'shards_per_client', 'train_fraction', 'val_fraction',
                    'test_fraction', 'max_train_samples')


def _config_from_flags():
  if FLAGS.partition_file:
    given = [f'--{n}' for n in _PARTITION_FLAGS if FLAGS[n].present]
    if given:
      raise app.UsageError(
          f'--partition_file fixes the partition and its splits; drop '
          f'{", ".join(given)} (the file records the values it was made '
          'with).')
  if FLAGS.min_samples is not None and FLAGS.partition != 'dirichlet':
    raise app.UsageError('--min_samples applies to --partition=dirichlet '
                         f'only, not {FLAGS.partition!r}.')
  partition_params = {
      'iid': {},
      'dirichlet': {'alpha': FLAGS.alpha},
      'disjoint': {'classes_per_client': FLAGS.classes_per_client},
      'shards': {'shards_per_client': FLAGS.shards_per_client},
  }[FLAGS.partition]
  if FLAGS.partition == 'dirichlet' and FLAGS.min_samples is not None:
    partition_params['min_samples'] = FLAGS.min_samples
  dataset_options = {}
  if FLAGS.image_size is not None:      # the loader checks the value
    dataset_options['image_size'] = FLAGS.image_size
  try:
    model_options = json.loads(FLAGS.model_options)
    algorithm_params = json.loads(FLAGS.algorithm_params)
  except json.JSONDecodeError as e:
    raise app.UsageError(f'--model_options/--algorithm_params must be JSON: '
                         f'{e}') from e
  return experiment.ExperimentConfig(
      dataset=FLAGS.dataset, data_dir=FLAGS.data_dir,
      dataset_options=dataset_options, pool_test=FLAGS.pool_test,
      partition=FLAGS.partition, partition_params=partition_params,
      partition_file=FLAGS.partition_file, num_clients=FLAGS.num_clients,
      clients_per_round=_clients_per_round(),
      train_fraction=FLAGS.train_fraction, val_fraction=FLAGS.val_fraction,
      test_fraction=FLAGS.test_fraction,
      max_train_samples=FLAGS.max_train_samples, model=FLAGS.model,
      model_options=model_options, rounds=FLAGS.rounds,
      local_epochs=FLAGS.local_epochs, batch_size=FLAGS.batch_size,
      optimizer=FLAGS.optimizer, learning_rate=FLAGS.learning_rate,
      momentum=FLAGS.momentum, weight_decay=FLAGS.weight_decay,
      server_learning_rate=FLAGS.server_learning_rate,
      learning_rate_decay=FLAGS.learning_rate_decay, augment=FLAGS.augment,
      eval_every=FLAGS.eval_every, local_eval=FLAGS.local_eval,
      seed=FLAGS.seed,
      algorithm_params=algorithm_params,
      max_concurrent_clients=FLAGS.max_concurrent_clients)


class Summary(NamedTuple):
  """What the comparison table needs from one algorithm's `RunResult`.

  Kept instead of the `RunResult`, which holds the final server state, the
  client-state store and the process: with several algorithms those would
  stay in memory until the program ends.
  """
  final: dict[str, Any]
  best_test: dict[str, Any]
  seconds_per_round: float


def comparison_table(results: Mapping[str, Summary]) -> str:
  """A Markdown table of final and best-on-test personalized metrics."""
  local = any('local/accuracy_mean' in r.final for r in results.values())
  lines = ['| algorithm | personalized acc (final) | macro-F1 (final) | '
           'worst-10% acc | global acc | best acc (round) | s/round |'
           + (' local acc own / pooled test (Eq. 10) |' if local else ''),
           '|---|---|---|---|---|---|---|' + ('---|' if local else '')]
  for name, res in results.items():
    f = res.final
    def pct(key, d=f):
      return f'{100 * d[key]:.2f}' if key in d else '-'
    if 'personal/accuracy_mean' not in f:       # regression
      lines.append(f"| {name} | MAE {f['personal/mae_mean']:.3f} | - | - | "
                   f"{f.get('global/mae_mean', float('nan')):.3f} | - | "
                   f'{res.seconds_per_round:.2f} |')
      continue
    lines.append(
        f"| {name} | {pct('personal/accuracy_mean')} | "
        f"{pct('personal/macro_f1_mean')} | "
        f"{pct('personal/accuracy_worst10')} | {pct('global/accuracy_mean')}"
        f" | {pct('personal/accuracy_mean', res.best_test)} "
        f"({res.best_test['round']}) | {res.seconds_per_round:.2f} |"
        + (f" {pct('local/accuracy_mean')} / "
           f"{pct('local_pooled/accuracy_mean')} |" if local else ''))
  return '\n'.join(lines)


def _check_resumable(out: str, config: experiment.ExperimentConfig,
                     data: experiment.PreparedData, name: str) -> None:
  """A UsageError when `out` holds checkpoints of `name` that this run
  could not resume: written with another configuration or model."""
  state = checkpoint.newest_loop_state(os.path.join(out, 'checkpoints'))
  if state is None:
    return
  problem = None
  if state.get('fingerprint', '') != experiment.fingerprint(config, name):
    problem = 'another configuration'
  elif state.get('architecture') and (
      state['architecture'] != data.spec.architecture()):
    problem = 'a model built differently'
  if problem:
    raise app.UsageError(
        f'{out} holds checkpoints of {name} written with {problem}; use '
        'another --output_dir, or --noresume to start afresh. Nothing was '
        'written.')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  if FLAGS.list:
    _print_list()
    return 0
  if not FLAGS.output_dir:
    raise app.UsageError('--output_dir is required.')
  if not FLAGS.algorithm:
    raise app.UsageError('--algorithm names no algorithm.')
  repeated = sorted({n for n in FLAGS.algorithm
                     if FLAGS.algorithm.count(n) > 1})
  if repeated:
    raise app.UsageError(f'--algorithm names {repeated} more than once.')
  for name in FLAGS.algorithm:
    if name not in algorithms.ALGORITHMS:
      raise app.UsageError(f'unknown algorithm {name!r}; known: '
                           f'{sorted(algorithms.ALGORITHMS)}.')
    info = algorithms.ALGORITHMS[name]
    if FLAGS.local_eval and not info.reports_local_models:
      raise app.UsageError(
          f'--local_eval: {name} does not report its clients\' models after '
          'local training (FedPSD Eq. 10); leave it out or drop --local_eval.')
  config = _config_from_flags()
  stray = sorted(set(config.algorithm_params) - set(FLAGS.algorithm))
  if stray:
    raise app.UsageError(
        f'--algorithm_params names {stray}, which --algorithm '
        f'({",".join(FLAGS.algorithm)}) does not run.')
  t0 = time.time()
  data = grid.prepare(config)
  assigned = data.partition.num_assigned()
  print(f'{config.dataset}: {data.partition.num_samples} samples'
        + (f' ({assigned} assigned to clients)'
           if assigned != data.partition.num_samples else '')
        + f', {len(data.client_ids)} clients, prepared in '
        f'{time.time() - t0:.1f}s', flush=True)
  several = len(FLAGS.algorithm) > 1

  def output_dir(name):
    return os.path.join(FLAGS.output_dir, name) if several else FLAGS.output_dir

  # Every algorithm is checked before the first one trains or anything is
  # written (a refused resume must not overwrite partition.json).
  for name in FLAGS.algorithm:
    try:
      algorithms.check(name, config.algorithm_params.get(name, {}),
                       data.spec.task)
    except ValueError as e:
      raise app.UsageError(str(e)) from e
    if FLAGS.resume:
      _check_resumable(output_dir(name), config, data, name)
  os.makedirs(FLAGS.output_dir, exist_ok=True)
  data.partition.save(os.path.join(FLAGS.output_dir, 'partition.json'))
  results = collections.OrderedDict()
  for name in FLAGS.algorithm:
    bar = tqdm(total=config.rounds, desc=name, disable=not FLAGS.progress,
               file=sys.stderr, dynamic_ncols=True)

    log = grid.eval_logger(name, config.rounds)

    def progress(r, row, bar=bar, log=log):
      post = {'loss': f"{row['train_loss']:.3f}"}
      if 'test/personal/accuracy_mean' in row:
        post['acc'] = f"{row['test/personal/accuracy_mean']:.3f}"
      bar.set_postfix(post)
      bar.update(1)
      if not FLAGS.progress:       # a log line per evaluation instead
        log(r, row)

    out = output_dir(name)
    # Ends this algorithm's TFF worker: the next one starts a fresh worker.
    result = experiment.run_into(
        out, config, data, name, progress=progress,
        checkpoint_every=FLAGS.checkpoint_every, resume=FLAGS.resume,
        store_dir=(os.path.join(out, 'client_states')
                   if FLAGS.client_store == 'disk' else None))
    bar.close()
    results[name] = Summary(result.final, result.best_test,
                            result.seconds_per_round)
    del result
  table = comparison_table(results)
  print(table)
  if several:
    with open(os.path.join(FLAGS.output_dir, 'comparison.md'), 'w') as f:
      f.write(table + '\n')
  print(f'results in {FLAGS.output_dir} ({time.time() - t0:.0f}s)')
  return 0


if __name__ == '__main__':
  app.run(main)
