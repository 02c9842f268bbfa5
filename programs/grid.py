"""Shared pieces of the paper-table programs: method specs and grid cells.

A grid cell is one `(data config, method)` run in its own folder, written by
`experiment.write_outputs` (summary.json, rounds.csv, clients.csv) with
checkpoints beside it, so a grid program can be stopped and restarted: a
cell whose summary.json reports the asked number of rounds is done, a cell
with checkpoints resumes (also to run more rounds than it had, unless the
method's schedule depends on the total rounds), and a finished cell that
ran with another configuration is refused (`needs_run`).

Methods are registered algorithm names with optional hyperparameters,
`name:key=value;key=value`, values in JSON (`ditto:lambda_=0.01`,
`fedpsd:rhpk=false;psd=true`); encoders of the architecture sweeps take
options the same way (`resnet10:width=0.25`).
"""

import copy
import json
import os
import re
import shutil
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any, Optional

from absl import app
from absl import flags
from absl import logging
import numpy as np

import keras_models
import tff_pfl
from tff_pfl import experiment
from tff_pfl.algorithms import registry as algorithms
from tff_pfl.data import registry as data_registry

_SAFE = re.compile(r'[^A-Za-z0-9_.=-]+')


def safe_name(text: str) -> str:
  """A folder name for a method or cell label."""
  return _SAFE.sub('_', text)


def parse_spec(text: str, known: Collection[str],
               what: str) -> tuple[str, dict[str, Any]]:
  """'name:key=value;key=value' -> ('name', {key: value}), values in JSON;
  a UsageError naming `what` for an unknown name or a malformed item."""
  name, _, params = text.partition(':')
  if name not in known:
    raise app.UsageError(f'unknown {what} {name!r}; known: '
                         f'{sorted(known)}.')
  out = {}
  for item in filter(None, params.split(';')):
    key, sep, value = item.partition('=')
    if not sep or not key:
      raise app.UsageError(f'{what} parameter {item!r} of {text!r} must be '
                           'key=value.')
    try:
      out[key] = json.loads(value)
    except json.JSONDecodeError as e:
      raise app.UsageError(f'value of {key} in {text!r} is not JSON: '
                           f'{value!r}') from e
  return name, out


def parse_method(text: str) -> tuple[str, dict[str, Any]]:
  """'ditto:lambda_=0.01;personal_epochs=2' -> ('ditto', {...}); a
  UsageError for a parameter the algorithm does not take."""
  name, params = parse_spec(text, algorithms.ALGORITHMS, 'method')
  try:
    algorithms.check(name, params)
  except ValueError as e:
    raise app.UsageError(f'{text!r}: {e}') from e
  return name, params


def parse_encoder(text: str) -> tuple[str, dict[str, Any]]:
  """'resnet10:width=0.25' -> ('resnet10', {'width': 0.25}): an encoder of
  `keras_models.ENCODERS` and options its builder accepts."""
  name, options = parse_spec(text, keras_models.ENCODERS, 'encoder')
  try:
    keras_models.check_encoder_options(name, options)
  except TypeError as e:
    raise app.UsageError(f'{text!r}: {e}') from e
  return name, options


def method_params(method: str,
                  default_params: Optional[dict[str, Any]] = None
                  ) -> tuple[str, dict[str, Any]]:
  """The algorithm name and the hyperparameters a cell of `method` runs
  with: `default_params` overridden by those in the spec."""
  name, params = parse_method(method)
  return name, dict(default_params or {}, **params)


def check_dataset(name: str) -> None:
  """A UsageError for an unknown data set name, before anything runs."""
  try:
    data_registry.check_name(name)
  except ValueError as e:
    raise app.UsageError(str(e)) from e


# Where this project's own input checks live (for `prepare`).
_OWN_CODE = tuple(os.path.dirname(os.path.abspath(m.__file__)) + os.sep
                  for m in (tff_pfl, keras_models))


def _raised_here(error: BaseException) -> bool:
  """Whether `error` was raised by this project's code, not a library's."""
  tb = error.__traceback__
  if tb is None:
    return False
  while tb.tb_next is not None:
    tb = tb.tb_next
  return os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(_OWN_CODE)


def prepare(config: experiment.ExperimentConfig) -> experiment.PreparedData:
  """`experiment.prepare`, with bad input as a `UsageError`.

  An unknown data set, model or option, a missing data file or a partition
  that cannot be made is the user's to fix: the program prints the message
  and its flags' help, not a traceback. Only errors that this project's
  checks raise are turned into a `UsageError`; one raised inside
  TensorFlow, Keras or NumPy keeps its traceback (it may be a bug).
  """
  try:
    return experiment.prepare(config)
  except (ValueError, FileNotFoundError) as e:
    if not _raised_here(e):
      raise
    raise app.UsageError(str(e)) from e


def load_summary(out: str) -> Optional[dict[str, Any]]:
  """The cell's summary.json, or None when the cell has not finished."""
  path = os.path.join(out, 'summary.json')
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def cell_config(config: experiment.ExperimentConfig, method: str,
                default_params: Optional[dict[str, Any]] = None
                ) -> tuple[str, experiment.ExperimentConfig]:
  """The algorithm name and the config a cell of `method` runs with:
  `config` with `algorithm_params` set to `{name: hyperparameters}`."""
  name, params = method_params(method, default_params)
  cfg = copy.deepcopy(config)
  cfg.algorithm_params = {name: params}
  return name, cfg


def _config_changes(ran: dict[str, Any], cfg: experiment.ExperimentConfig
                    ) -> dict[str, tuple[Any, Any]]:
  """{field: (ran with, asked for)} over `experiment.resume_fields` of a
  cell config (`cell_config`, whose one `algorithm_params` entry names the
  algorithm); a field that `ran` lacks (written before the field existed)
  counts as its default."""
  if len(cfg.algorithm_params) != 1:
    raise ValueError('a cell config names one algorithm in its '
                     f'algorithm_params, got {sorted(cfg.algorithm_params)}.')
  (algorithm,) = cfg.algorithm_params
  default = experiment.config_to_json(experiment.ExperimentConfig())
  want = experiment.resume_fields(experiment.config_to_json(cfg), algorithm)
  ran = dict(default, **ran)
  return {k: (ran[k], v) for k, v in want.items() if ran[k] != v}


def needs_run(out: str, rounds: int,
              required_keys: tuple[str, ...] = (),
              config: Optional[experiment.ExperimentConfig] = None,
              architecture: Optional[str] = None) -> bool:
  """Whether the cell in `out` must (re)run to give `rounds` rounds.

  A cell is done when its summary's final round is `rounds` and its final
  evaluation holds every one of `required_keys`; one with fewer rounds
  resumes from its checkpoints. A finished cell without those keys (it ran
  before those metrics existed) is reopened: its summary is renamed
  `summary.stale.json` and its newest checkpoint removed, so that it
  resumes from the checkpoint before and recomputes the last rounds (all
  of them when it has only one checkpoint).

  Args:
    out: the cell's folder.
    rounds: the rounds the cell must have run.
    required_keys: metrics its final evaluation must hold.
    config: the cell's config (`cell_config`), checked against the one
      in its summary.
    architecture: `ModelSpec.architecture()` of the model this code
      builds, checked against the one in the summary.

  Raises:
    ValueError: the cell ran more rounds than `rounds`; or (when `config`
      is given) it ran with other hyperparameters, which would put a run
      of another method variant in the table under this one's name, or
      with another value of a field of `experiment.resume_fields` (data,
      partition, model, optimizer, ...; for FedPSD also the total
      rounds, which its schedule depends on, so its finished cells cannot
      run on to more rounds), which would mix settings in one table; or
      (when `architecture` is given) the cell's summary records another
      model architecture: the model changed since the cell ran. A summary
      written before architectures or a config field were recorded is
      accepted for those.
  """
  summary = load_summary(out)
  if summary is None:
    return True
  ran_with = summary.get('model_architecture')
  if architecture and ran_with and ran_with != architecture:
    raise ValueError(
        f'{out} ran with model architecture {ran_with!r}, but this code '
        f'builds {architecture!r}: the model changed since (layer settings '
        'or weight shapes), so its numbers are not this model\'s; use '
        'another output folder or remove the cell.')
  ran_config = summary.get('config')
  if config is not None and ran_config is not None:
    ran = ran_config.get('algorithm_params')
    want = experiment.config_to_json(config)['algorithm_params']
    if ran is not None and ran != want:
      raise ValueError(
          f'{out} ran with algorithm_params {ran}, not the {want} asked '
          'for; use another output folder or remove the cell.')
    changes = _config_changes(ran_config, config)
    changes.pop('algorithm_params', None)
    if changes:
      listed = '; '.join(f'{k}: ran with {a!r}, asked for {b!r}'
                         for k, (a, b) in sorted(changes.items()))
      raise ValueError(
          f'{out} ran with another configuration ({listed}), so its '
          'numbers would mix two settings in one table; use another output '
          'folder or remove the cell.')
  final = summary.get('final_round') or {}
  done = final.get('round')
  if done is not None and done > rounds:
    raise ValueError(f'{out} ran {done} rounds, more than the {rounds} '
                     'asked for; use another output folder.')
  if done != rounds:
    return True
  if all(k in final for k in required_keys):
    return False
  os.replace(os.path.join(out, 'summary.json'),
             os.path.join(out, 'summary.stale.json'))
  ckpt = os.path.join(out, 'checkpoints')
  if os.path.isdir(ckpt):
    names = sorted(n for n in os.listdir(ckpt) if n.startswith('round_'))
    for name in (names[-1:] if len(names) > 1 else names):
      shutil.rmtree(os.path.join(ckpt, name))
  return True


def eval_logger(label: str, rounds: int) -> Callable[[int, dict], None]:
  """A `progress` callback printing one line per evaluation round: train
  loss, personalized test accuracy (MAE for regression), round seconds."""

  def progress(r: int, row: dict[str, Any]) -> None:
    for key, name in (('test/personal/accuracy_mean', 'personalized acc'),
                      ('test/personal/mae_mean', 'personalized MAE')):
      if key in row:
        print(f'{label} round {r}/{rounds}: train_loss '
              f'{row["train_loss"]:.3f} {name} {row[key]:.4f} '
              f'({row["round_seconds"]:.1f}s)', flush=True)
        return

  return progress


def warn_methods_beyond(flag_values: flags.FlagValues, what: str,
                        choosers: Sequence[str],
                        methods: Collection[str]) -> None:
  """Warns when --methods is narrowed but a part of the grid uses others.

  Parts of a paper grid beyond its main table (the sweep figures, the
  ablations, the t-SNE plot, the architecture table) take their methods
  from their own flags (default: the paper's), not from --methods; a user
  who narrows --methods and leaves those flags alone would otherwise train
  cells they did not ask for (a 200-round CIFAR-10 cell takes 15 minutes
  to 2 hours on 2 cores). Call it only for a part that the run uses (one
  that trains, or under --write_only reads, cells of its own).

  Args:
    flag_values: the program's parsed flags, with a `methods` list flag and
      each of `choosers`.
    what: the part of the grid, for the message (e.g. 'Fig. 9').
    choosers: the flags that choose the part's methods or cells (e.g. its
      variants and its settings); a value given on the command line for
      any of them is taken as chosen (no warning).
    methods: the methods the part uses.
  """
  if (flag_values['methods'].using_default_value
      or not all(flag_values[name].using_default_value for name in choosers)):
    return
  extra = [m for m in dict.fromkeys(methods) if m not in flag_values.methods]
  if extra:
    logging.warning(
        '%s: uses %s, not in --methods (--methods does not limit this '
        'part; give %s to choose).', what, ', '.join(extra),
        ' or '.join(f'--{name}' for name in choosers))


def run_cell(config: experiment.ExperimentConfig,
             data: experiment.PreparedData, method: str, out: str, *,
             checkpoint_every: int,
             default_params: Optional[dict[str, Any]] = None,
             store_dir: Optional[str] = None,
             after: Optional[Callable[[Any, str], None]] = None) -> Any:
  """Runs one cell (resuming its checkpoints) and writes its outputs.

  Through `experiment.run_into`, which ends with `runtime.shutdown()`: the
  cell's TFF worker stops (the next cell starts a fresh one), so `after` is
  the last place a cell may call a TFF computation.

  Args:
    config: the data/training config of the cell.
    data: `experiment.prepare(config)`.
    method: a method spec, see the module docstring.
    out: the cell's folder.
    checkpoint_every: rounds between checkpoints.
    default_params: hyperparameters applied unless the spec overrides them.
    store_dir: keep client states on disk there (many clients).
    after: optional `(result, out) -> None` run after the outputs are
      written (e.g. to dump per-client state for a figure).
  """
  name, cfg = cell_config(config, method, default_params)
  t0 = time.time()
  result = experiment.run_into(
      out, cfg, data, name, label=method, after=after, store_dir=store_dir,
      checkpoint_every=checkpoint_every,
      progress=eval_logger(out, cfg.rounds))
  acc = result.final.get('personal/accuracy_mean', float('nan'))
  print(f'{out}: personalized acc {acc:.4f} ({time.time() - t0:.0f}s)',
        flush=True)
  return result


def mean_std(values: list[float], asked: Optional[int] = None) -> str:
  """'m ± s' (population std) in percent points of fractions.

  '-' when empty; one value is written 'm (1 seed)', since '± 0.00' would
  read as a measured spread. Given `asked`, the number of seeds asked for,
  a mean over fewer (but more than one) says so: 'm ± s (2 of 3 seeds)'.
  """
  if not values:
    return '-'
  v = 100 * np.asarray(values, np.float64)
  if len(v) == 1:
    return f'{v[0]:.2f} (1 seed)'
  text = f'{v.mean():.2f} ± {v.std():.2f}'
  if asked is not None and len(v) < asked:
    text += f' ({seeds_of(len(v), asked)})'
  return text


def seeds_of(finished: int, asked: int) -> str:
  """'2 of 3 seeds': how a cell names a mean over fewer seeds than asked."""
  return f'{finished} of {asked} seeds'


def mark_partial(ax, x: float, top: float, finished: int,
                 asked: int) -> None:
  """Writes 'finished/asked' 2 points above a value that lacks some seeds."""
  if finished < asked:
    ax.annotate(f'{finished}/{asked}', (x, top), xytext=(0, 2),
                textcoords='offset points', ha='center', va='bottom',
                fontsize=6)


def draw_seed_line(ax, points: list[tuple[float, list[float]]],
                   n_seeds: int, label: str) -> bool:
  """A line through the mean over the finished seeds at each x.

  Each of `points` is (x, the values of its finished seeds); an x with no
  finished seed is left out.

  A point over fewer seeds than the `n_seeds` asked for is drawn hollow,
  as `draw_seed_bars` hatches its bar. It carries no 'finished/asked' text:
  a sweep's points of several methods sit fractions of a point apart, where
  such labels overprint each other whichever side they take; the figure's
  legend explains the hollow marker (`partial_seeds_handle`) and the
  Markdown table beside it gives each cell's count.

  Returns whether any point was drawn hollow.
  """
  found = [(x, float(np.mean(v)), len(v)) for x, v in points if v]
  if not found:
    return False
  line, = ax.plot([x for x, _, _ in found], [y for _, y, _ in found], 'o-',
                  label=label)
  partial = [(x, y) for x, y, finished in found if finished < n_seeds]
  if partial:
    # The line's colour, so that the next method's is not taken.
    ax.plot([x for x, _ in partial], [y for _, y in partial], 'o',
            color=line.get_color(), markerfacecolor='white',
            zorder=line.get_zorder() + 0.1)
  return bool(partial)


def partial_seeds_handle(n_seeds: int):
  """A legend entry for `draw_seed_line`'s hollow points."""
  from matplotlib.lines import Line2D  # pylint: disable=g-import-not-at-top
  return Line2D([], [], marker='o', linestyle='none', color='grey',
                markerfacecolor='white',
                label=f'hollow: fewer than {n_seeds} seeds\n'
                '(count in the table)')


def draw_seed_bars(ax, accs: dict[tuple[str, str], list[float]],
                   methods: list[str], columns: list[str],
                   n_seeds: int) -> None:
  """Grouped bars of the mean ± std over the finished seeds per (method,
  column) of `accs`; a cell with no finished seed draws no bar.

  A bar over fewer seeds than the `n_seeds` asked for is hatched and
  labelled 'finished/asked', so that a partial mean does not read like a
  full one (the Markdown beside the figure says the same in words).
  """
  width = 0.8 / len(methods)
  for i, method in enumerate(methods):
    found = [(j + i * width, accs[method, c])
             for j, c in enumerate(columns) if accs[method, c]]
    bars = ax.bar([x for x, _ in found], [np.mean(v) for _, v in found],
                  width, yerr=[np.std(v) for _, v in found], capsize=2,
                  label=method)
    for bar, (x, v) in zip(bars, found):
      if len(v) < n_seeds:
        bar.set_hatch('///')
        bar.set_edgecolor('white')
      mark_partial(ax, x, np.mean(v) + np.std(v), len(v), n_seeds)
  ax.set_xticks([j + 0.4 - width / 2 for j in range(len(columns))])
  ax.set_xticklabels(columns)
