r"""AFedCL paper grid: Table II, Figs. 4, 5, 7, 8, 9, 10 (afedcl.txt, Sec. V).

Runs every (partition, shots, seed, method) cell of a grid with the paper's
setting (5 clients, all sampled every round, Adam 1e-3, 3 local epochs,
k training samples per client) and writes, under --output_dir:

  table2.md / table2.csv   mean +/- std over seeds of the final mean
                           personalized accuracy and macro-F1, per method and
                           (partition, shots); a mean over fewer seeds
                           than asked says so, missing cells are listed
  fig4_discrimination.png  L_D and the discriminator's accuracy per round,
                           AFedCL with and without DCC
  fig5_ld_vs_fusion.png    final L_D^k vs A_k over clients, regression line
  fig7_tsne.png            t-SNE of each client's personalized test
                           features (rows clients, columns --tsne_methods;
                           AFedCL's are the fused features of Eq. 9)
  fig8_lambda.png          accuracy of AFedCL and Ditto over --lambdas (mean
                           +/- std over seeds)
  fig9a_backbones.png/.md  --sweep_methods per encoder (--model, --backbones)
  fig9b_clients.png/.md    --sweep_methods for --client_counts clients
                           sharing --total_samples training samples
  fig10_ablation.png       AFedCL without DCC / CAA / AFF vs full

Methods are names from `programs.run --list`, optionally with parameters:
`afedcl:dcc=0`, `ditto:lambda_=0.01`. Every cell is a resumable run in
`DIR/<partition>_k<shots>[_<variant>]/seed<seed>/<method>/`; a finished
cell (its summary.json reports --rounds rounds) is not run again, one with
fewer rounds resumes and one run with another configuration is refused
(`grid.needs_run`), so the program can be stopped and restarted at will;
an unfinished cell checkpoints every --checkpoint_every rounds (by default
--eval_every) and resumes from its newest checkpoint.
Example (the paper's NEU-CLS rows; hours on 2 cores):

  python -m programs.afedcl_tables --dataset=neu_cls --data_dir=DATA \
    --image_size=64 --model=mobilenet_v2 --model_options='{"alpha": 0.35}' \
    --partitions=disjoint:2,dirichlet:0.1 --shots=5,10,20 --seeds=0,1,2 \
    --rounds=200 --output_dir=runs/afedcl_neu
"""

import collections
import json
import os
import sys
import time
from typing import Any, Optional

from absl import app
from absl import flags
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
# TensorFlow must be imported before app.run (see programs/run.py).
import numpy as np
import tensorflow as tf  # pylint: disable=unused-import

from programs import grid
from tff_pfl import experiment
from tff_pfl.templates import fusion

FLAGS = flags.FLAGS
flags.DEFINE_string('dataset', 'neu_cls', 'Data set name.')
flags.DEFINE_string('data_dir', None, 'Folder with the data files.')
flags.DEFINE_integer('image_size', 64, 'Image side for image-folder data.')
flags.DEFINE_list('partitions', ['disjoint:2', 'dirichlet:0.1'],
                  'disjoint:<classes per client> or dirichlet:<alpha>.')
flags.DEFINE_list('shots', ['5', '10', '20'], 'Training samples per client.')
flags.DEFINE_list('seeds', ['0', '1', '2'], 'Seeds.')
flags.DEFINE_list('methods', ['afedcl', 'nofl', 'fedavg', 'fedprox', 'fedper',
                              'fedrep', 'ditto', 'fedala'],
                  'Methods (name[:param=value;...]).')
flags.DEFINE_list('ablation', ['afedcl:dcc=0', 'afedcl:caa=0',
                               'afedcl:aff=0'],
                  'AFedCL ablation variants, run at the first partition '
                  'and shots (Fig. 4 plots afedcl:dcc=0, Fig. 10 the three '
                  'defaults); --methods does not limit them.')
flags.DEFINE_list('lambdas', [], 'If given, lambda sweep for AFedCL and '
                  'Ditto (Fig. 8), e.g. 0.01,0.1,1.')
flags.DEFINE_list('tsne_methods', ['fedavg', 'fedrep', 'fedala', 'afedcl'],
                  'Methods whose per-client features are plotted with t-SNE '
                  '(Fig. 7; first cell, first seed); empty to skip; '
                  '--methods does not limit them.')
flags.DEFINE_list('backbones', [], 'Extra encoders for Fig. 9(a), e.g. '
                  'resnet18,resnet50, with options as methods have them, '
                  'e.g. mobilenet_v2:alpha=0.35 (--model with '
                  '--model_options is the first bar).')
flags.DEFINE_list('client_counts', [], 'Client counts for Fig. 9(b), e.g. '
                  '2,10, sharing --total_samples training samples.')
flags.DEFINE_integer('total_samples', 50, 'Training samples shared by all '
                     'clients in Fig. 9(b).')
flags.DEFINE_list('sweep_methods', ['afedcl', 'fedavg', 'fedrep', 'fedala'],
                  'Methods of Fig. 9 (first partition, first shots); '
                  '--methods does not limit them.')
flags.DEFINE_integer('num_clients', 5, 'Clients (paper: 5).')
flags.DEFINE_integer('rounds', 200, 'Rounds (paper: 200).')
flags.DEFINE_integer('local_epochs', 3, 'Local epochs (paper: 3).')
flags.DEFINE_integer('batch_size', 8, 'Batch size.')
flags.DEFINE_string('model', 'mobilenet_v2', 'Encoder.')
flags.DEFINE_string('model_options', '{}', 'JSON encoder options.')
flags.DEFINE_enum('optimizer', 'adam', ['adam', 'sgd'], 'Client optimizer.')
flags.DEFINE_float('learning_rate', 1e-3, 'Client learning rate.')
flags.DEFINE_float('afedcl_lambda', 0.1, 'AFedCL lambda for the table.')
flags.DEFINE_integer('eval_every', 10, 'Evaluate every N rounds.')
flags.DEFINE_integer('checkpoint_every', None, 'Rounds between an unfinished '
                     'cell\'s checkpoints (default: --eval_every). Not part '
                     'of a cell\'s configuration: a cell resumes from its '
                     'newest checkpoint whatever value wrote it.',
                     lower_bound=1)
flags.DEFINE_string('output_dir', None, 'Where everything is written.')
flags.DEFINE_integer('max_concurrent_clients', None, 'Cap on clients the '
                     'TFF worker trains at once (default: all of a round): '
                     'lowers its peak memory; results and finished cells '
                     'are unaffected.', lower_bound=1)
flags.DEFINE_bool('write_only', False, 'Train nothing: write the tables and '
                  'figures from the cells that finished (the others are '
                  'listed as missing).')

parse_method = grid.parse_method
load_summary = grid.load_summary


def parse_partition(text: str) -> tuple[str, dict]:
  kind, _, value = text.partition(':')
  if kind == 'disjoint':
    return kind, {'classes_per_client': int(value or 2)}
  if kind == 'dirichlet':
    return kind, {'alpha': float(value or 0.1), 'min_samples': 1}
  raise app.UsageError(f'partition must be disjoint:<c> or dirichlet:<alpha>'
                       f', got {text!r}.')


def cell_dir(partition: str, shots: int, seed: int, method: str,
             variant: str = '') -> str:
  label = f'{partition}_k{shots}' + (f'_{variant}' if variant else '')
  return os.path.join(FLAGS.output_dir, grid.safe_name(label),
                      f'seed{seed}', grid.safe_name(method))


def final_accuracies(partition, shots, seeds, method,
                     variant: str = '') -> list[float]:
  """Final mean personalized accuracy (%) of the cell at each finished seed."""
  summaries = [load_summary(cell_dir(partition, shots, s, method, variant))
               for s in seeds]
  return [100 * x['final_round']['personal/accuracy_mean']
          for x in summaries if x]


def _dump_afedcl_clients(result, out: str) -> None:
  """Per-client final L_D and A_k, for Fig. 5."""
  rows = []
  for cid in result.store.client_ids():
    s = result.store.get(cid)
    rows.append({'client': cid,
                 'discrimination_loss': float(s.discrimination_loss),
                 'fusion_weight': float(fusion.fusion_weight(
                     s.fusion_logit))})
  with open(os.path.join(out, 'afedcl_clients.json'), 'w') as f:
    json.dump(rows, f, indent=1)


def _features_dumper(data):
  """After-hook saving each client's personalized test features (Fig. 7)."""

  def dump(result, out: str) -> None:
    arrays = {}
    for cid in data.client_ids:
      xs, ys = [], []
      for batch in data.dataset_fn(cid, 0, 'test'):
        xs.append(batch['x'])
        ys.append(batch['y'].numpy())
      feats = result.process.personal_features(
          result.server_state.global_model_weights, result.store.get(cid),
          tf.concat(xs, 0))
      arrays[f'{cid}/features'] = np.asarray(feats).reshape(len(feats), -1)
      arrays[f'{cid}/labels'] = np.concatenate(ys)
    np.savez_compressed(os.path.join(out, 'features.npz'), **arrays)

  return dump


def defaults(method: str, seed: int) -> Optional[dict[str, Any]]:
  """This grid's default hyperparameters of `method`."""
  if parse_method(method)[0] == 'afedcl':
    return {'lambda_': FLAGS.afedcl_lambda, 'seed': seed}
  return None


def needs_run(out: str, config, method: str, seed: int,
              architecture: str) -> bool:
  """`grid.needs_run`, refusing a cell run with another configuration,
  other hyperparameters or another model architecture."""
  _, cfg = grid.cell_config(config, method, defaults(method, seed))
  return grid.needs_run(out, FLAGS.rounds, config=cfg,
                        architecture=architecture)


def run_cell(config, data, method: str, out: str,
             features: bool = False) -> None:
  name, _ = parse_method(method)
  hooks = []
  if name == 'afedcl':
    hooks.append(_dump_afedcl_clients)
  if features:
    hooks.append(_features_dumper(data))

  def after(result, out):
    for hook in hooks:
      hook(result, out)

  grid.run_cell(config, data, method, out,
                checkpoint_every=(FLAGS.checkpoint_every
                                  or max(1, FLAGS.eval_every)),
                default_params=defaults(method, config.seed), after=after)


def write_table(methods, partitions, shots, seeds) -> list[str]:
  """Writes table2.md/csv; returns the missing cells."""
  header = ['method'] + [f'{p} k={k}' for p in partitions for k in shots]
  md = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
  csv_rows, missing = [], []
  for method in methods:
    cells = [method]
    for p in partitions:
      for k in shots:
        acc, f1 = [], []
        for s in seeds:
          summary = load_summary(cell_dir(p, k, s, method))
          if summary is None:
            missing.append(f'{method} {p} k={k} seed={s}')
            continue
          acc.append(100 * summary['final_round']['personal/accuracy_mean'])
          f1.append(100 * summary['final_round']['personal/macro_f1_mean'])
        if not acc:
          cells.append('-')
          continue
        if len(acc) == 1:
          # One seed has no spread to show; '± 0.00' would read as measured.
          cells.append(f'{acc[0]:.2f} (F1 {f1[0]:.2f}; 1 seed)')
        else:
          seeds_text = (f'n={len(acc)}' if len(acc) == len(seeds)
                        else grid.seeds_of(len(acc), len(seeds)))
          cells.append(f'{np.mean(acc):.2f} ± {np.std(acc):.2f} '
                       f'(F1 {np.mean(f1):.2f} ± {np.std(f1):.2f}; '
                       f'{seeds_text})')
        csv_rows.append([method, p, k, np.mean(acc), np.std(acc),
                         np.mean(f1), np.std(f1), len(acc)])
    md.append('| ' + ' | '.join(cells) + ' |')
  with open(os.path.join(FLAGS.output_dir, 'table2.md'), 'w') as f:
    f.write('\n'.join(md) + '\n')
    if missing:
      f.write('\nMissing runs: ' + ', '.join(missing) + '\n')
  with open(os.path.join(FLAGS.output_dir, 'table2.csv'), 'w') as f:
    f.write('method,partition,shots,acc_mean,acc_std,f1_mean,f1_std,seeds\n')
    for r in csv_rows:
      f.write(','.join(str(v) for v in r) + '\n')
  return missing


def write_figures(partitions, shots, seeds) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  import pandas as pd  # pylint: disable=g-import-not-at-top
  from scipy import stats  # pylint: disable=g-import-not-at-top
  p, k, s = partitions[0], shots[0], seeds[0]

  def rounds_of(method):
    path = os.path.join(cell_dir(p, k, s, method), 'rounds.csv')
    return pd.read_csv(path) if os.path.exists(path) else None

  # Fig. 4: (a) L_D and (b) the discriminator's accuracy per round, with
  # and without DCC (client means over the round's stage-1 batches).
  fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
  panels = (('discrimination_loss', '(a) discrimination loss $L_D$'),
            ('discrimination_accuracy', '(b) discrimination accuracy'))
  for ax, (name, ylabel) in zip(axes, panels):
    key = f'train/{name}_client_mean'
    for method, label in (('afedcl', 'AFedCL'), ('afedcl:dcc=0', 'w/o DCC')):
      df = rounds_of(method)
      if df is not None and key in df:
        ax.plot(df['round'], df[key], label=label)
    ax.set_xlabel('round')
    ax.set_ylabel(ylabel)
    if ax.get_legend_handles_labels()[0]:
      ax.legend()
  fig.tight_layout()
  fig.savefig(os.path.join(FLAGS.output_dir, 'fig4_discrimination.png'))
  plt.close(fig)

  # Fig. 5: final L_D^k vs A_k over all AFedCL cells, with a fitted line
  # and Spearman's rank correlation. L_D spans ~1e-24 to ~1e2 at 200 rounds
  # (a discriminator that separates perfectly next to one that has lost),
  # so the x axis is symlog and the rank correlation, which the few huge
  # values cannot dominate, is the number to read.
  xs, ys = [], []
  for part in partitions:
    for shot in shots:
      for seed in seeds:
        path = os.path.join(cell_dir(part, shot, seed, 'afedcl'),
                            'afedcl_clients.json')
        if os.path.exists(path):
          with open(path) as f:
            for row in json.load(f):
              xs.append(row['discrimination_loss'])
              ys.append(row['fusion_weight'])
  fig, ax = plt.subplots(figsize=(5, 3.5))
  if xs:
    ax.scatter(xs, ys, s=12)
    if len(set(xs)) > 1 and len(set(ys)) > 1:
      slope, icpt = np.polyfit(xs, ys, 1)
      grid_x = np.linspace(min(xs), max(xs), 200)
      rho = stats.spearmanr(xs, ys).correlation
      ax.plot(grid_x, slope * grid_x + icpt, 'r-',
              label=f'fit: A = {slope:.3g} L_D + {icpt:.3f}')
      ax.set_title(f'Spearman rho = {rho:.2f} (n = {len(xs)})')
      ax.legend()
    ax.set_xscale('symlog', linthresh=1e-3)
  ax.set_xlabel('final discrimination loss $L_D^k$')
  ax.set_ylabel('fusion weight $A_k$')
  fig.tight_layout()
  fig.savefig(os.path.join(FLAGS.output_dir, 'fig5_ld_vs_fusion.png'))
  plt.close(fig)

  # Fig. 10: ablation bars (mean over seeds at the first partition/shots).
  labels, values = [], []
  for method, label in (('afedcl', 'full'), ('afedcl:dcc=0', 'w/o DCC'),
                        ('afedcl:caa=0', 'w/o CAA'),
                        ('afedcl:aff=0', 'w/o AFF')):
    accs = final_accuracies(p, k, seeds, method)
    if accs:
      labels.append(label)
      values.append(np.mean(accs))
  fig, ax = plt.subplots(figsize=(5, 3.5))
  ax.bar(labels, values)
  ax.set_ylabel('mean personalized accuracy (%)')
  fig.tight_layout()
  fig.savefig(os.path.join(FLAGS.output_dir, 'fig10_ablation.png'))
  plt.close(fig)

  # Fig. 8: lambda sensitivity of AFedCL and Ditto, mean +/- std over the
  # seeds that finished.
  if FLAGS.lambdas:
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for name in ('afedcl', 'ditto'):
      xs, ys, errs = [], [], []
      for lam in FLAGS.lambdas:
        accs = final_accuracies(p, k, seeds, f'{name}:lambda_={lam}')
        if accs:
          xs.append(float(lam))
          ys.append(np.mean(accs))
          errs.append(np.std(accs))
      if xs:
        ax.errorbar(xs, ys, yerr=errs, fmt='o-', capsize=3, label=name)
    ax.set_xscale('log')
    ax.set_xlabel('lambda')
    ax.set_ylabel('mean personalized accuracy (%)')
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(FLAGS.output_dir, 'fig8_lambda.png'))
    plt.close(fig)


def make_config(partition: str, shots: int, seed: int, *, model=None,
                model_options=None,
                num_clients=None) -> experiment.ExperimentConfig:
  """A cell's config; `model=None` is --model with --model_options."""
  kind, params = parse_partition(partition)
  clients = num_clients or FLAGS.num_clients
  return experiment.ExperimentConfig(
      dataset=FLAGS.dataset, data_dir=FLAGS.data_dir,
      dataset_options=({'image_size': FLAGS.image_size}
                       if FLAGS.dataset in ('neu_cls', 'cifar10') else {}),
      partition=kind, partition_params=params, num_clients=clients,
      clients_per_round=clients, max_train_samples=shots,
      model=model or FLAGS.model,
      model_options=(json.loads(FLAGS.model_options) if model is None
                     else dict(model_options or {})),
      rounds=FLAGS.rounds, local_epochs=FLAGS.local_epochs,
      batch_size=FLAGS.batch_size, optimizer=FLAGS.optimizer,
      learning_rate=FLAGS.learning_rate, eval_every=FLAGS.eval_every,
      seed=seed, max_concurrent_clients=FLAGS.max_concurrent_clients)


def run_variant(partition, shots, seeds, variant, **config_kwargs) -> None:
  """Fig. 9 cells: --sweep_methods at one (partition, shots) variant."""
  for seed in seeds:
    # Prepared even when every cell has finished: the finished cells'
    # model architecture is checked against the model this code builds.
    config = make_config(partition, shots, seed, **config_kwargs)
    data = grid.prepare(config)
    architecture = data.spec.architecture()
    todo = [m for m in FLAGS.sweep_methods if needs_run(
        cell_dir(partition, shots, seed, m, variant), config, m, seed,
        architecture)]
    for method in todo:
      run_cell(config, data, method,
               cell_dir(partition, shots, seed, method, variant))


def train_grid(shots, seeds, counts, lambda_variants, first) -> None:
  """Runs every cell of the grid that is not finished yet."""
  for partition in FLAGS.partitions:
    for k in shots:
      for seed in seeds:
        config = make_config(partition, k, seed)
        data = grid.prepare(config)
        architecture = data.spec.architecture()   # a model build: once
        # Ablation and lambda sweep (all seeds) and t-SNE features (first
        # seed) run only at the first (partition, shots) cell. Fresh lists:
        # never alias the flags.
        first_cell = (partition, k) == first
        extra = (list(FLAGS.ablation) + lambda_variants if first_cell
                 else [])
        tsne = first_cell and seed == seeds[0]
        for method in dict.fromkeys(
            FLAGS.methods + extra + (FLAGS.tsne_methods if tsne else [])):
          out = cell_dir(partition, k, seed, method)
          features = tsne and method in FLAGS.tsne_methods
          if needs_run(out, config, method, seed, architecture) or (
              features and not os.path.exists(
                  os.path.join(out, 'features.npz'))):
            run_cell(config, data, method, out, features=features)
        write_table(FLAGS.methods, FLAGS.partitions, shots, seeds)
  for backbone in fig9_backbones():
    name, options = grid.parse_encoder(backbone)
    run_variant(*first, seeds, backbone, model=name, model_options=options)
  for c in counts:
    run_variant(first[0], FLAGS.total_samples // c, seeds, f'K{c}',
                num_clients=c)


def fig9_backbones() -> list[str]:
  """The encoders of Fig. 9(a) with cells of their own (not --model's)."""
  return [b for b in dict.fromkeys(FLAGS.backbones) if b != FLAGS.model]


def warn_methods_beyond(counts: list[int]) -> None:
  """Warns for each part of the grid beyond Table II (Figs. 4, 7, 9, 10) that
  uses methods a narrowed --methods leaves out (`grid.warn_methods_beyond`).
  """
  grid.warn_methods_beyond(FLAGS, 'Fig. 7 (t-SNE)', ('tsne_methods',),
                           FLAGS.tsne_methods)
  grid.warn_methods_beyond(FLAGS, 'Figs. 4 and 10 (ablation)', ('ablation',),
                           FLAGS.ablation)
  if fig9_backbones() or counts:
    grid.warn_methods_beyond(FLAGS, 'Fig. 9', ('sweep_methods',),
                             FLAGS.sweep_methods)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  if not FLAGS.output_dir:
    raise app.UsageError('--output_dir is required.')
  grid.check_dataset(FLAGS.dataset)
  for m in (FLAGS.methods + FLAGS.ablation + FLAGS.tsne_methods
            + FLAGS.sweep_methods):
    parse_method(m)
  for backbone in FLAGS.backbones:
    grid.parse_encoder(backbone)
  for p in FLAGS.partitions:
    parse_partition(p)
  shots = [int(k) for k in FLAGS.shots]
  seeds = [int(s) for s in FLAGS.seeds]
  counts = [int(c) for c in FLAGS.client_counts]
  for c in counts:
    if not 1 <= c <= FLAGS.total_samples:
      raise app.UsageError(f'client count {c} must be in [1, '
                           f'--total_samples={FLAGS.total_samples}].')
  warn_methods_beyond(counts)
  lambda_variants = [f'{n}:lambda_={lam}' for lam in FLAGS.lambdas
                     for n in ('afedcl', 'ditto')]
  os.makedirs(FLAGS.output_dir, exist_ok=True)
  t0 = time.time()
  first = (FLAGS.partitions[0], shots[0])
  if not FLAGS.write_only:
    train_grid(shots, seeds, counts, lambda_variants, first)
  missing = write_table(FLAGS.methods, FLAGS.partitions, shots, seeds)
  write_figures(FLAGS.partitions, shots, seeds)
  write_fig7(*first, seeds[0])
  write_fig9(*first, seeds, counts)
  print(open(os.path.join(FLAGS.output_dir, 'table2.md')).read())
  print(f'done in {time.time() - t0:.0f}s; missing Table II cells: '
        f'{len(missing)}')
  return 0


def write_fig7(partition, shots, seed) -> None:
  """t-SNE of each client's personalized test features, per method."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  from sklearn import manifold  # pylint: disable=g-import-not-at-top
  loaded = {}
  for method in FLAGS.tsne_methods:
    path = os.path.join(cell_dir(partition, shots, seed, method),
                        'features.npz')
    if os.path.exists(path):
      loaded[method] = np.load(path)
  if not loaded:
    return
  clients = sorted({key.split('/')[0] for f in loaded.values()
                    for key in f.files})
  fig, axes = plt.subplots(len(clients), len(loaded), squeeze=False,
                           figsize=(2.6 * len(loaded), 2.4 * len(clients)))
  for j, (method, arrays) in enumerate(loaded.items()):
    for i, cid in enumerate(clients):
      ax = axes[i][j]
      x, y = arrays[f'{cid}/features'], arrays[f'{cid}/labels']
      if len(x) > 2:
        # Standardized per feature, so that a few large ReLU units do not
        # dominate the distances.
        x = (x - x.mean(axis=0)) / (x.std(axis=0) + 1e-6)
        emb = manifold.TSNE(n_components=2, init='pca', random_state=seed,
                            perplexity=min(30.0, (len(x) - 1) / 3)
                            ).fit_transform(x)
        ax.scatter(emb[:, 0], emb[:, 1], c=y, cmap='tab10', s=6,
                   vmin=0, vmax=9)
      ax.set_xticks([])
      ax.set_yticks([])
      if i == 0:
        ax.set_title(method, fontsize=9)
      if j == 0:
        ax.set_ylabel(f'client {cid}', fontsize=8)
  fig.tight_layout()
  fig.savefig(os.path.join(FLAGS.output_dir, 'fig7_tsne.png'), dpi=120)
  plt.close(fig)


def write_fig9(partition, shots, seeds, counts) -> None:
  """(a) accuracy per backbone, (b) per number of clients: PNG (mean ± std
  over the finished seeds as error bars; a value over fewer seeds than
  asked is labelled 'finished/asked', and hatched in (a)) and the same
  values as Markdown (fig9a_backbones.md, fig9b_clients.md)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  def write_md(name, columns, accs) -> None:
    md = ['| method | ' + ' | '.join(columns) + ' |',
          '|' + '---|' * (len(columns) + 1)]
    for method in FLAGS.sweep_methods:
      md.append(f'| {method} | ' + ' | '.join(
          grid.mean_std([a / 100 for a in accs[method, c]], len(seeds))
          for c in columns) + ' |')
    with open(os.path.join(FLAGS.output_dir, name), 'w') as f:
      f.write('\n'.join(md) + f'\n\nSeeds asked for: {seeds}; a cell '
              'shows the finished ones ("1 seed", "2 of 3 seeds" where '
              'some are missing).\n')

  if FLAGS.backbones:
    backbones = list(dict.fromkeys([FLAGS.model] + FLAGS.backbones))
    accs = {(m, b): final_accuracies(partition, shots, seeds, m,
                                     '' if b == FLAGS.model else b)
            for m in FLAGS.sweep_methods for b in backbones}
    write_md('fig9a_backbones.md', backbones, accs)
    fig, ax = plt.subplots(figsize=(7.5, 3.5))
    grid.draw_seed_bars(ax, accs, FLAGS.sweep_methods, backbones,
                        len(seeds))
    ax.set_ylabel('mean personalized accuracy (%)')
    # Beside the axes: inside, it covers bars as methods are added.
    ax.legend(fontsize=7, loc='upper left', bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    fig.savefig(os.path.join(FLAGS.output_dir, 'fig9a_backbones.png'))
    plt.close(fig)
  if counts:
    accs = {(m, str(c)): final_accuracies(
        partition, FLAGS.total_samples // c, seeds, m, f'K{c}')
            for m in FLAGS.sweep_methods for c in counts}
    write_md('fig9b_clients.md', [str(c) for c in counts], accs)
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for method in FLAGS.sweep_methods:
      found = [(c, accs[method, str(c)]) for c in counts
               if accs[method, str(c)]]
      if found:
        ax.errorbar([c for c, _ in found], [np.mean(v) for _, v in found],
                    yerr=[np.std(v) for _, v in found], fmt='o-', capsize=3,
                    label=method)
        for c, v in found:
          grid.mark_partial(ax, c, np.mean(v) + np.std(v), len(v),
                            len(seeds))
    ax.set_xlabel(f'clients (sharing {FLAGS.total_samples} training samples)')
    ax.set_ylabel('mean personalized accuracy (%)')
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(FLAGS.output_dir, 'fig9b_clients.png'))
    plt.close(fig)


if __name__ == '__main__':
  app.run(main)
