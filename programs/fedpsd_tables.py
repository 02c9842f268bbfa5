r"""FedPSD paper grid: Tables I-VII and Figs. 3-5 (fedpsd.txt, Sec. V-VI).

Runs every (setting, seed, method) cell with the paper's setting (100
clients, 10% sampled per round, 5 local epochs, SGD lr 0.01 x0.99 per round,
momentum 0.9, weight decay 1e-5, batch 50, SimpleCNN, random crop / flip /
normalize for CIFAR-10, normalize only for MNIST, whose digits must not be
flipped) and writes, under --output_dir:

  table1.md/.csv  average client top-1 (Eq. 10), pathological sharding
                  settings, read as --client_metric says (default
                  local_pooled):
                    local         each sampled client's model after local
                                  training, before aggregation, on its own
                                  test split, mean over the round's clients
                    local_pooled  the same models on the pooled test set
                    personal      every client's personalized model (the
                                  global model for FedAvg-type methods) on
                                  its own test split, mean over ALL clients
                  and table1_<protocol>.md/.csv for each of the three
  table2.md/.csv  the same, LDA (Dirichlet) settings
  table3.md/.csv  global model top-1 on the union of all clients' test
                  splits (the sample-weighted mean over clients)
  table4.md/.csv  rounds to reach FedAvg's final average client accuracy
  table5.md/.csv  rounds to reach FedAvg's final global accuracy
  table6.md/.csv  ablation RHPK / PSD / CLL (--ablation at --ablation_settings)
  table7.md/.csv  architectures (--architectures at --architecture_setting)
  fig3_curves_<setting>.png   global and client accuracy per round, mean
                              over the seeds' cells (band: min to max)
  fig4_local_epochs.png       client accuracy vs local epochs (--epoch_sweep)
  fig4_local_epochs.md/.csv   its numbers (--client_metric), and
  fig4_local_epochs_global.md/.csv  the global model's at the same points
  fig5_participation.png/.md/.csv, fig5_participation_global.md/.csv
                              the same vs participation rate

Settings are `<dataset>:shards=<S>` or `<dataset>:dirichlet=<alpha>`.
Methods are names from `programs.run --list`, optionally with parameters
(`fedpsd:psd=false`); without them a baseline runs with the values of
FedNTD's released configs (`BASELINE_PARAMS`: FedProx mu 1.0, MOON mu 0.1),
and a finished cell run with other values, or with another data, model or
training setting, is refused, not reused. Each
cell is a resumable run in `DIR/<setting>[_<variant>]/seed<seed>/<method>/`;
a finished cell (its summary.json reports --rounds rounds and the Eq. 10
metrics) is skipped, an unfinished one resumes from its newest checkpoint
(written every --checkpoint_every rounds, by default --eval_every), and
one finished before the local-model metrics existed recomputes its last
rounds (`grid.needs_run`), so the program can be stopped and restarted at
will. FedPSD's alpha = t / total_rounds, so its cells cannot run on to more
rounds (the total rounds are part of its configuration): a finished one is
refused, an unfinished one stops at its checkpoint's configuration check;
give such a grid another --output_dir.
Values are mean +/- std over the seeds that finished, each read at its last
round or, with --final_evals=N, as the mean of its last N evaluations;
a mean over fewer seeds than asked says so in its cell ("2 of 3 seeds"),
and the missing cells are listed under each table. Rounds-to-target are
resolved to --eval_every rounds.

Per-client train/test split: each client's data (from the pooled train and
test images) is split 75/25, so "client test data" follows the client's own
label distribution as in the paper's Eq. 10. CIFAR-100 (Tables I-III's last
columns) is not available offline: `cifar100` loads through TFDS by name
where the network is available.

Example (the paper's setting; days on 2 cores, see docs/results.md for the
reduced runs made here):

  python -m programs.fedpsd_tables --data_dir=../shared/data \
    --settings=mnist:shards=2,mnist:dirichlet=0.1,cifar10:shards=2,\
cifar10:shards=5,cifar10:dirichlet=0.05,cifar10:dirichlet=0.1 \
    --seeds=0,1,2 --rounds=200 --output_dir=runs/fedpsd_tables
"""

import itertools
import os
import shutil
import time
from typing import Any, Callable, NamedTuple

from absl import app
from absl import flags
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
# TensorFlow must be imported before app.run (see programs/run.py).
import numpy as np
import tensorflow as tf  # pylint: disable=unused-import

from programs import grid
from tff_pfl import experiment

FLAGS = flags.FLAGS
METHODS = ['fedavg', 'fedprox', 'fedcurv', 'fednova', 'scaffold', 'moon',
           'fedntd', 'fedlmd', 'fedpsd']
ABLATION = ['fedpsd:rhpk=true;psd=false;cll=false',
            'fedpsd:rhpk=true;psd=true;cll=false']
# The baselines' hyperparameters in this grid. The paper gives none; its
# setting (Sec. V-C, also sharding S=2, the SimpleCNN and the x0.99
# schedule) is the one of FedNTD's released configs (Lee-Gihun/FedNTD,
# config/<method>.json), which FedLMD's code shares, so every baseline runs
# with those configs' values. The library defaults already equal them for
# FedNTD (tau 1, beta 1), FedLMD, FedCurv (lambda 1, 500 Fisher samples)
# and SCAFFOLD; FedProx and MOON default to their own papers' code
# (mu 0.01; mu 1) and take FedNTD's here: fedprox.json mu = 1.0,
# moon.json mu = 0.1, tau (our `temperature`) = 0.5. A method spec's own
# parameters win (`--methods=fedprox:mu=0.01`).
BASELINE_PARAMS = {'fedprox': {'mu': 1.0},
                   'moon': {'mu': 0.1, 'temperature': 0.5}}

flags.DEFINE_string('data_dir', None, 'Folder with the data files.')
flags.DEFINE_list('settings', ['mnist:shards=2', 'mnist:dirichlet=0.1',
                               'cifar10:shards=2', 'cifar10:shards=5',
                               'cifar10:dirichlet=0.05',
                               'cifar10:dirichlet=0.1'],
                  '<dataset>:shards=<S> or <dataset>:dirichlet=<alpha>.')
flags.DEFINE_list('seeds', ['0', '1', '2'], 'Seeds.')
flags.DEFINE_list('methods', METHODS, 'Methods (name[:param=value;...]).')
flags.DEFINE_list('ablation', ABLATION, 'FedPSD ablation variants (Table '
                  'VI; they run with FedAvg and full FedPSD at '
                  '--ablation_settings, whatever --methods says; empty: no '
                  'ablation).')
flags.DEFINE_list('ablation_settings', ['cifar10:shards=2',
                                        'cifar10:dirichlet=0.05'],
                  'Settings of Table VI (empty: no ablation).')
flags.DEFINE_list('architectures', [], 'Extra encoders for Table VII, e.g. '
                  'resnet10,vgg11, with options as methods have them, e.g. '
                  'resnet10:width=0.25 (SimpleCNN comes from the main '
                  'grid).')
flags.DEFINE_string('architecture_setting', 'cifar10:shards=2',
                    'Setting of Table VII.')
flags.DEFINE_list('architecture_methods', ['fedavg', 'fedprox', 'fedcurv',
                                           'fedntd', 'fedlmd', 'fedpsd'],
                  'Methods of Table VII (with --architectures; --methods '
                  'does not limit them).')
flags.DEFINE_list('epoch_sweep', [], 'Local epochs for Fig. 4, e.g. '
                  '1,3,10,20 (5 comes from the main grid).')
flags.DEFINE_list('participation_sweep', [], 'Participation rates for '
                  'Fig. 5, e.g. 0.05,0.2,0.3.')
flags.DEFINE_list('sweep_methods', ['fedavg', 'fedntd', 'fedlmd', 'fedpsd'],
                  'Methods of Figs. 4 and 5 (at the first setting); '
                  '--methods does not limit them.')
flags.DEFINE_integer('num_clients', 100, 'Clients (paper: 100).')
flags.DEFINE_float('participation_rate', 0.1, 'Sampled fraction per round.')
flags.DEFINE_integer('rounds', 200, 'Rounds (paper: 200).')
flags.DEFINE_integer('local_epochs', 5, 'Local epochs (paper: 5).')
flags.DEFINE_integer('batch_size', 50, 'Batch size (paper: 50).')
flags.DEFINE_float('learning_rate', 0.01, 'Client SGD learning rate.')
flags.DEFINE_float('learning_rate_decay', 0.99, 'Per-round decay.')
flags.DEFINE_float('momentum', 0.9, 'Client SGD momentum.')
flags.DEFINE_float('weight_decay', 1e-5, 'Client weight decay.')
flags.DEFINE_string('model', 'simple_cnn', 'Encoder of the main grid.')
flags.DEFINE_enum('augment', 'auto', ['auto'] + list(experiment.AUGMENTATIONS),
                  'auto: crop_flip_normalize for colour images (CIFAR), '
                  'normalize for MNIST (digits must not be flipped).')
flags.DEFINE_integer('max_train_samples', None, 'Cap of training samples '
                     'per client (for quick runs; the paper uses all).')
flags.DEFINE_integer('eval_every', 5, 'Evaluate all clients every N rounds.')
flags.DEFINE_integer('checkpoint_every', None, 'Rounds between an unfinished '
                     'cell\'s checkpoints (default: --eval_every). Not part '
                     'of a cell\'s configuration: a cell resumes from its '
                     'newest checkpoint whatever value wrote it. Shorter '
                     'spacing loses less of a stopped long cell.',
                     lower_bound=1)
flags.DEFINE_string('output_dir', None, 'Where everything is written.')
flags.DEFINE_integer('max_concurrent_clients', None, 'Cap on clients the '
                     'TFF worker trains at once (default: all of a round): '
                     'lowers its peak memory; results and finished cells '
                     'are unaffected.', lower_bound=1)
flags.DEFINE_bool('write_only', False, 'Train nothing: write the tables and '
                  'figures from the cells that finished (the others are '
                  'listed as missing).')
# Eq. 10 read three ways: the sampled clients' models after local training
# (before aggregation) on their own test split, the same models on the pooled
# test set, and every client's personalized model on its own test split.
PROTOCOLS = {
    'local': 'local/accuracy_mean',
    'local_pooled': 'local_pooled/accuracy_mean',
    'personal': 'personal/accuracy_mean',
}
LOCAL_KEYS = (PROTOCOLS['local'], PROTOCOLS['local_pooled'])
flags.DEFINE_integer(
    'final_evals', 1, 'Accuracy tables and figures read each cell at its '
    'last round (1, the paper\'s reading) or as the mean over its last N '
    'evaluated rounds: the local readings come from the round\'s sampled '
    'clients, so one round\'s value moves with its cohort. '
    'Tables IV/V keep the final round as their target.', lower_bound=1)
flags.DEFINE_enum('client_metric', 'local_pooled', list(PROTOCOLS),
                  'Which reading of Eq. 10 Tables I, II, IV, VI, VII and the '
                  'figures use (default: the one that reproduces the '
                  'paper\'s FedAvg and FedPSD numbers, docs/results.md); '
                  'Tables I and II are also written for each of the three '
                  '(table1_<protocol>.md).')


def parse_setting(text: str) -> tuple[str, str, dict]:
  """'cifar10:shards=2' -> ('cifar10', 'shards', {...})."""
  dataset, _, part = text.partition(':')
  kind, _, value = part.partition('=')
  try:
    if kind == 'shards':
      return dataset, kind, {'shards_per_client': int(value)}
    if kind == 'dirichlet':
      return dataset, kind, {'alpha': float(value), 'min_samples': 2}
  except ValueError as e:
    raise app.UsageError(f'bad setting value in {text!r}: {e}') from e
  raise app.UsageError(f'setting must be <dataset>:shards=<S> or '
                       f'<dataset>:dirichlet=<alpha>, got {text!r}.')


def cell_dir(setting: str, seed: int, method: str, variant: str = '') -> str:
  label = setting + (f'_{variant}' if variant else '')
  return os.path.join(FLAGS.output_dir, grid.safe_name(label),
                      f'seed{seed}', grid.safe_name(method))


def augmentation(dataset: str) -> str:
  if FLAGS.augment != 'auto':
    return FLAGS.augment
  return 'normalize' if dataset == 'mnist' else 'crop_flip_normalize'


def make_config(setting: str, seed: int, *, model=None, model_options=None,
                local_epochs=None,
                participation_rate=None) -> experiment.ExperimentConfig:
  dataset, kind, params = parse_setting(setting)
  rate = participation_rate or FLAGS.participation_rate
  return experiment.ExperimentConfig(
      dataset=dataset, data_dir=FLAGS.data_dir, partition=kind,
      partition_params=params, num_clients=FLAGS.num_clients,
      clients_per_round=max(1, int(round(rate * FLAGS.num_clients))),
      max_train_samples=FLAGS.max_train_samples,
      model=model or FLAGS.model, model_options=dict(model_options or {}),
      rounds=FLAGS.rounds,
      local_epochs=local_epochs or FLAGS.local_epochs,
      batch_size=FLAGS.batch_size, optimizer='sgd',
      learning_rate=FLAGS.learning_rate, momentum=FLAGS.momentum,
      weight_decay=FLAGS.weight_decay,
      learning_rate_decay=FLAGS.learning_rate_decay,
      augment=augmentation(dataset),
      eval_every=FLAGS.eval_every, local_eval=True, seed=seed,
      max_concurrent_clients=FLAGS.max_concurrent_clients)


def run_cells(setting, seeds, methods, variant='', **config_kwargs) -> None:
  if FLAGS.write_only:
    return
  for seed in seeds:
    # Prepared even when every cell has finished: the finished cells'
    # model architecture is checked against the model this code builds.
    config = make_config(setting, seed, **config_kwargs)
    data = grid.prepare(config)
    architecture = data.spec.architecture()
    todo = []
    for m in methods:
      _, cfg = grid.cell_config(config, m, defaults(m))
      if grid.needs_run(cell_dir(setting, seed, m, variant), FLAGS.rounds,
                        LOCAL_KEYS, config=cfg, architecture=architecture):
        todo.append(m)
    for method in todo:
      out = cell_dir(setting, seed, method, variant)
      grid.run_cell(config, data, method, out,
                    checkpoint_every=(FLAGS.checkpoint_every
                                      or max(1, FLAGS.eval_every)),
                    default_params=defaults(method),
                    store_dir=os.path.join(out, 'client_states'))


def defaults(method: str) -> dict[str, Any]:
  """This grid's default hyperparameters of `method` (BASELINE_PARAMS)."""
  return BASELINE_PARAMS.get(grid.parse_method(method)[0], {})


# --------------------------------------------------------------- tables

def final_values(setting, seeds, method, key, variant=''):
  """`key` of each seed's finished cell: at its last round or, with
  --final_evals=N > 1, the mean over its last N evaluated rounds."""
  values, missing = [], []
  for seed in seeds:
    out = cell_dir(setting, seed, method, variant)
    name = f'{method} {setting}{" " + variant if variant else ""} seed={seed}'
    summary = grid.load_summary(out)
    if summary is None or key not in summary['final_round']:
      missing.append(name)
    elif FLAGS.final_evals == 1:
      values.append(summary['final_round'][key])
    else:
      window = last_evaluations(out, key, FLAGS.final_evals)
      if window is None:
        missing.append(f'{name} (fewer than {FLAGS.final_evals} '
                       f'evaluations of {key})')
      else:
        values.append(float(np.mean(window)))
  return values, missing


def evaluated_curve(out: str, key: str):
  """The cell's evaluated rounds (rounds.csv) as a DataFrame of `round` and
  `value` (`key`, NaN where a round lacks it, as in a cell that recomputed
  only its end); None when the cell has no rounds.csv."""
  import pandas as pd  # pylint: disable=g-import-not-at-top
  path = os.path.join(out, 'rounds.csv')
  if not os.path.exists(path):
    return None
  df = pd.read_csv(path)
  evaluated = df.dropna(subset=['test/personal/accuracy_mean'])
  column = f'test/{key}'
  values = evaluated[column] if column in df else np.nan
  return pd.DataFrame({'round': evaluated['round'], 'value': values})


def last_evaluations(out: str, key: str, n: int):
  """`key` at the cell's last `n` evaluated rounds, or None when it has
  fewer (or `key` is missing at one of them)."""
  curve = evaluated_curve(out, key)
  if curve is None:
    return None
  last = curve.tail(n)
  if len(last) < n or last['value'].isna().any():
    return None
  return last['value'].tolist()


def reading() -> str:
  """How the accuracy tables read a cell (for their titles)."""
  if FLAGS.final_evals == 1:
    return ''
  return f', mean of the last {FLAGS.final_evals} evaluations'


def rounds_to_target(setting, seed, method, key, target):
  """First evaluated round whose `key` reaches `target`; None if never,
  'incomplete' when `key` is missing at some evaluated round."""
  curve = evaluated_curve(cell_dir(setting, seed, method), key)
  if curve is None:
    return None
  if curve['value'].isna().any():
    return 'incomplete'      # e.g. a cell that recomputed only its end
  hit = curve[curve['value'] >= target - 1e-12]
  return int(hit['round'].iloc[0]) if len(hit) else None


def write_table(name, title, rows, columns, cell_fn) -> None:
  """rows x columns table; cell_fn(row, column) -> (text, values, missing)."""
  if not columns:
    with open(os.path.join(FLAGS.output_dir, f'{name}.md'), 'w') as f:
      f.write(f'**{title}**\n\nNo setting of this table was run.\n')
    with open(os.path.join(FLAGS.output_dir, f'{name}.csv'), 'w') as f:
      f.write('method,column,value,std,n\n')
    return
  md = [f'**{title}**', '',
        '| method | ' + ' | '.join(columns) + ' |',
        '|---|' + '---|' * len(columns)]
  csv = ['method,column,value,std,n']
  missing = []
  for row in rows:
    cells = []
    for col in columns:
      text, values, miss = cell_fn(row, col)
      cells.append(text)
      missing += [m for m in miss if m not in missing]
      if values:
        csv.append(f'{row},{col},{np.mean(values)},{np.std(values)},'
                   f'{len(values)}')
    md.append(f'| {row} | ' + ' | '.join(cells) + ' |')
  if missing:
    md += ['', 'Missing runs: ' + ', '.join(missing)]
  with open(os.path.join(FLAGS.output_dir, f'{name}.md'), 'w') as f:
    f.write('\n'.join(md) + '\n')
  with open(os.path.join(FLAGS.output_dir, f'{name}.csv'), 'w') as f:
    f.write('\n'.join(csv) + '\n')


def accuracy_cell(seeds, key, where=None):
  """Cell function: mean ± std of `key` over seeds, marked when fewer
  seeds finished than were asked for. `where(column)` gives the (setting,
  variant) of a column; by default the column is a setting."""
  def cell(method, column):
    setting, variant = where(column) if where else (column, '')
    values, missing = final_values(setting, seeds, method, key, variant)
    return grid.mean_std(values, len(seeds)), values, missing
  return cell


def _as_float(value: str) -> float:
  try:
    return float(value)
  except ValueError:
    return float('nan')


class Sweep(NamedTuple):
  """One of Figs. 4 and 5: a config value swept at the first setting."""
  figure: str                            # 'Fig. 4', for messages
  values: list[str]                      # the flag's swept values
  variant: Callable[[float], str]        # cell-folder suffix of a value
  label: str                             # axis label
  default: float                         # the main grid's value (no suffix)
  config: Callable[[float], dict[str, Any]]  # make_config keyword args


def sweeps() -> dict[str, Sweep]:
  """Figs. 4 and 5 by output file name."""
  return {
      'fig4_local_epochs': Sweep(
          'Fig. 4', FLAGS.epoch_sweep, lambda e: f'E{int(e)}', 'local epochs',
          float(FLAGS.local_epochs), lambda e: {'local_epochs': int(e)}),
      'fig5_participation': Sweep(
          'Fig. 5', FLAGS.participation_sweep, lambda r: f'rate{r:g}',
          'participation rate', FLAGS.participation_rate,
          lambda r: {'participation_rate': r}),
  }


def check_sweeps(settings: list[str]) -> None:
  """UsageError for sweep values that no cell could run."""
  for name, sweep in sweeps().items():
    if sweep.values and not settings:
      raise app.UsageError(f'{name} runs at the first of --settings, and '
                           '--settings is empty.')
  for value in FLAGS.epoch_sweep:
    epochs = _as_float(value)
    if not (epochs >= 1 and epochs.is_integer()):
      raise app.UsageError(f'--epoch_sweep values must be whole numbers of '
                           f'local epochs >= 1, got {value!r}.')
  for value in FLAGS.participation_sweep:
    if not 0 < _as_float(value) <= 1:
      raise app.UsageError(f'--participation_sweep values must be rates in '
                           f'(0, 1], got {value!r}.')


def ablation_methods() -> list[str]:
  """Table VI's rows: FedAvg, the --ablation variants, full FedPSD (each
  once, where it first comes)."""
  return list(dict.fromkeys(['fedavg'] + FLAGS.ablation + ['fedpsd']))


def ablation_settings() -> list[str]:
  """Table VI's settings: --ablation_settings, none with an empty
  --ablation (FedAvg and FedPSD alone are no ablation)."""
  return FLAGS.ablation_settings if FLAGS.ablation else []


def warn_methods_beyond() -> None:
  """Warns for each part of the grid beyond the main tables (Table VI's
  ablation, Table VII, Figs. 4 and 5) that uses methods a narrowed
  --methods leaves out (`grid.warn_methods_beyond`).
  """
  if ablation_settings():
    grid.warn_methods_beyond(
        FLAGS, f'Table VI (ablation at {",".join(ablation_settings())})',
        ('ablation', 'ablation_settings'), ablation_methods())
  if FLAGS.architectures:
    grid.warn_methods_beyond(FLAGS, 'Table VII', ('architecture_methods',),
                             FLAGS.architecture_methods)
  figures = [sweep.figure for sweep in sweeps().values()
             if any(variant for _, variant in sweep_points(sweep))]
  if figures:
    grid.warn_methods_beyond(FLAGS, ' and '.join(figures),
                             ('sweep_methods',), FLAGS.sweep_methods)


def sweep_points(sweep: Sweep) -> list[tuple[float, str]]:
  """(x, cell variant) at each point of a sweep, the main grid's included."""
  xs = sorted(set([sweep.default] + [float(v) for v in sweep.values]))
  return [(x, '' if x == sweep.default else sweep.variant(x)) for x in xs]


def write_sweep_tables(setting, seeds, client_key, server_key) -> None:
  """The numbers behind Figs. 4 and 5: method x swept value, client
  accuracy (the figure's) and the global model's."""
  for name, sweep in sweeps().items():
    if not sweep.values:
      continue
    points = {f'{x:g}': (setting, variant)
              for x, variant in sweep_points(sweep)}
    for suffix, key, what in (('', client_key, 'average client top-1 (%, '
                               f'{FLAGS.client_metric})'),
                              ('_global', server_key,
                               'global model top-1 (%)')):
      write_table(name + suffix,
                  f'{what} by {sweep.label}, {setting}{reading()}',
                  FLAGS.sweep_methods, list(points),
                  accuracy_cell(seeds, key, points.get))


def rounds_cell(seeds, key):
  def cell(method, setting):
    hits, missing, never = [], [], 0
    for seed in seeds:
      base = grid.load_summary(cell_dir(setting, seed, 'fedavg'))
      this = grid.load_summary(cell_dir(setting, seed, method))
      if this is None or key not in this['final_round']:
        missing.append(f'{method} {setting} seed={seed}')
        continue
      if base is None or key not in base['final_round']:
        # The target is FedAvg's, which --methods may leave out.
        missing.append(f'fedavg {setting} seed={seed} (the target)')
        continue
      found = rounds_to_target(setting, seed, method, key,
                               base['final_round'][key])
      if found == 'incomplete':
        missing.append(f'{method} {setting} seed={seed} (curve incomplete)')
      elif found is None:
        never += 1
      else:
        hits.append(found)
    if not hits and not never:
      return '-', [], missing
    text = (f'{np.mean(hits):.0f}' if hits else 'N/A')
    if never and hits:
      text += f' (N/A in {never})'
    return text, hits, missing
  return cell


def write_tables(settings, seeds) -> None:
  methods = FLAGS.methods
  client_key = PROTOCOLS[FLAGS.client_metric]
  server_key = 'global/accuracy_weighted'
  shards = [s for s in settings if ':shards=' in s]
  lda = [s for s in settings if ':dirichlet=' in s]
  cell = accuracy_cell(seeds, client_key)
  # table1_<reading>.md for every reading, and table1.md for the chosen
  # one (so no table1_<reading>.md is left from an earlier default).
  for protocol, key in PROTOCOLS.items():
    write_table(f'table1_{protocol}', 'Table I: average client top-1 (%), '
                f'sharding ({protocol}){reading()}', methods, shards,
                accuracy_cell(seeds, key))
    write_table(f'table2_{protocol}', 'Table II: average client top-1 (%), '
                f'LDA ({protocol}){reading()}', methods, lda,
                accuracy_cell(seeds, key))
  for table, ext in itertools.product(('table1', 'table2'), ('md', 'csv')):
    shutil.copyfile(
        os.path.join(FLAGS.output_dir, f'{table}_{FLAGS.client_metric}.{ext}'),
        os.path.join(FLAGS.output_dir, f'{table}.{ext}'))
  write_table('table3', f'Table III: global model top-1 (%){reading()}',
              methods, settings, accuracy_cell(seeds, server_key))
  write_table('table4', 'Table IV: rounds to FedAvg\'s final average client '
              f'accuracy (resolution {FLAGS.eval_every} rounds)', methods,
              settings, rounds_cell(seeds, client_key))
  write_table('table5', 'Table V: rounds to FedAvg\'s final global accuracy '
              f'(resolution {FLAGS.eval_every} rounds)', methods, settings,
              rounds_cell(seeds, server_key))
  write_table('table6',
              f'Table VI: ablation, average client top-1 (%){reading()}',
              ablation_methods(), ablation_settings(), cell)
  if FLAGS.architectures:
    archs = list(dict.fromkeys([FLAGS.model] + FLAGS.architectures))

    def by_arch(arch):
      return (FLAGS.architecture_setting,
              '' if arch == FLAGS.model else arch)
    write_table('table7', 'Table VII: average client top-1 (%) by '
                f'architecture, {FLAGS.architecture_setting}{reading()}',
                FLAGS.architecture_methods, archs,
                accuracy_cell(seeds, client_key, by_arch))
  if settings:
    write_sweep_tables(settings[0], seeds, client_key, server_key)


# -------------------------------------------------------------- figures

def seed_curves(setting: str, seeds, method: str, key: str):
  """`key` per evaluated round of `method`'s cells over `seeds`: a DataFrame
  with one column per seed that has the cell, indexed by round and kept to
  the rounds every one of them evaluated; None when no seed has the cell."""
  import pandas as pd  # pylint: disable=g-import-not-at-top
  columns = {}
  for seed in seeds:
    curve = evaluated_curve(cell_dir(setting, seed, method), key)
    if curve is not None and curve['value'].notna().any():
      columns[seed] = curve.set_index('round')['value']
  if not columns:
    return None
  return pd.DataFrame(columns).dropna()


def write_figures(settings, seeds) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  for setting in settings:      # Fig. 3: curves per setting, mean over seeds
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    for method in FLAGS.methods:
      for ax, key in zip(axes, ('global/accuracy_weighted',
                                PROTOCOLS[FLAGS.client_metric])):
        curves = seed_curves(setting, seeds, method, key)
        if curves is None or curves.empty:
          continue
        n = curves.shape[1]
        line, = ax.plot(curves.index, 100 * curves.mean(axis=1),
                        label=f'{method} ({n} seed{"s" if n > 1 else ""})')
        if n > 1:               # band: the seeds' minimum to maximum
          ax.fill_between(curves.index, 100 * curves.min(axis=1),
                          100 * curves.max(axis=1), color=line.get_color(),
                          alpha=0.15, linewidth=0)
    axes[0].set_title(f'global model, {setting}')
    axes[1].set_title(f'average client ({FLAGS.client_metric}), {setting}')
    for ax in axes:
      ax.set_xlabel('round')
      ax.set_ylabel('top-1 (%), mean over seeds (band: min-max)')
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(FLAGS.output_dir,
                             f'fig3_curves_{grid.safe_name(setting)}.png'))
    plt.close(fig)

  for name, sweep in sweeps().items():
    if not sweep.values:
      continue
    fig, ax = plt.subplots(figsize=(6.5, 3.5))
    partial = False
    at = sweep_points(sweep)
    for method in FLAGS.sweep_methods:
      points = []
      for x, variant in at:
        acc, _ = final_values(settings[0], seeds, method,
                              PROTOCOLS[FLAGS.client_metric], variant)
        points.append((x, [100 * a for a in acc]))
      partial |= grid.draw_seed_line(ax, points, len(seeds), method)
    xs = [x for x, _ in at]                      # sorted by sweep_points
    if len(xs) > 1 and min(np.diff(xs)) >= 0.05 * (xs[-1] - xs[0]):
      ax.set_xticks(xs, [f'{x:g}' for x in xs])   # ticks at the values run
    ax.set_xlabel(sweep.label)
    ax.set_ylabel('average client top-1 (%),\nmean over seeds')
    ax.set_title(settings[0] + reading())   # as the tables' titles say
    handles, _ = ax.get_legend_handles_labels()
    if partial:
      handles.append(grid.partial_seeds_handle(len(seeds)))
    # Beside the axes, not over them: the sweep's points span the plot.
    ax.legend(handles=handles, fontsize=7, loc='upper left',
              bbox_to_anchor=(1.02, 1), borderaxespad=0)
    fig.tight_layout()
    fig.savefig(os.path.join(FLAGS.output_dir, f'{name}.png'),
                bbox_inches='tight')
    plt.close(fig)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  if not FLAGS.output_dir:
    raise app.UsageError('--output_dir is required.')
  settings = list(FLAGS.settings)
  for s in settings + ablation_settings() + [FLAGS.architecture_setting]:
    grid.check_dataset(parse_setting(s)[0])
  for m in (FLAGS.methods + FLAGS.ablation + FLAGS.architecture_methods
            + FLAGS.sweep_methods):
    grid.parse_method(m)
  for arch in FLAGS.architectures:
    grid.parse_encoder(arch)
  check_sweeps(settings)
  warn_methods_beyond()
  seeds = [int(s) for s in FLAGS.seeds]
  os.makedirs(FLAGS.output_dir, exist_ok=True)
  t0 = time.time()
  for setting in settings:
    run_cells(setting, seeds, FLAGS.methods)
    write_tables(settings, seeds)
  for setting in ablation_settings():
    run_cells(setting, seeds, ablation_methods())
  if FLAGS.architectures:
    # Table VII's --model column, also where the main grid does not have
    # --architecture_setting (finished cells are skipped).
    run_cells(FLAGS.architecture_setting, seeds, FLAGS.architecture_methods)
  for arch in FLAGS.architectures:
    if arch != FLAGS.model:
      name, options = grid.parse_encoder(arch)
      run_cells(FLAGS.architecture_setting, seeds, FLAGS.architecture_methods,
                variant=arch, model=name, model_options=options)
  for sweep in sweeps().values():
    for x, variant in sweep_points(sweep):
      if variant:    # the main grid's value ran above
        run_cells(settings[0], seeds, FLAGS.sweep_methods, variant=variant,
                  **sweep.config(x))
  write_tables(settings, seeds)
  write_figures(settings, seeds)
  for name in ('table1', 'table2', 'table3', 'table6'):
    print(open(os.path.join(FLAGS.output_dir, f'{name}.md')).read())
  print(f'done in {time.time() - t0:.0f}s', flush=True)
  return 0


if __name__ == '__main__':
  app.run(main)
