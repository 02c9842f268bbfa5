"""Tests for programs.grid (cell bookkeeping; one test trains two tiny
cells)."""

import dataclasses
import json
import re

from absl import app
from absl import flags
import numpy as np
import psutil
import pytest

from programs import grid
from tff_pfl import experiment
from tff_pfl.core import runtime


def _finished_cell(path, rounds, final, checkpoints=(5, 10)):
  path.mkdir(parents=True)
  final = dict(final, round=rounds)
  (path / 'summary.json').write_text(json.dumps({'final_round': final}))
  for r in checkpoints:
    (path / 'checkpoints' / f'round_{r:06d}').mkdir(parents=True)
  return path


def test_needs_run_by_rounds_and_keys(tmp_path):
  assert grid.needs_run(str(tmp_path / 'absent'), 10)
  cell = _finished_cell(tmp_path / 'a', 10, {'personal/accuracy_mean': 0.5})
  assert not grid.needs_run(str(cell), 10)
  assert grid.needs_run(str(cell), 20)         # asked for more rounds
  assert (cell / 'summary.json').exists()     # ... which resume; kept
  with pytest.raises(ValueError, match='ran 10 rounds, more than the 5'):
    grid.needs_run(str(cell), 5)


def test_needs_run_reopens_cells_missing_a_metric(tmp_path):
  cell = _finished_cell(tmp_path / 'b', 10, {'personal/accuracy_mean': 0.5})
  assert grid.needs_run(str(cell), 10, ('local/accuracy_mean',))
  # The summary is set aside and the newest checkpoint goes; the run
  # resumes at round 5.
  assert not (cell / 'summary.json').exists()
  assert (cell / 'summary.stale.json').exists()
  assert sorted(p.name for p in (cell / 'checkpoints').iterdir()) == [
      'round_000005']
  done = _finished_cell(tmp_path / 'c', 10, {'local/accuracy_mean': 0.7})
  assert not grid.needs_run(str(done), 10, ('local/accuracy_mean',))
  only = _finished_cell(tmp_path / 'd', 10, {}, checkpoints=(10,))
  assert grid.needs_run(str(only), 10, ('local/accuracy_mean',))
  assert list((only / 'checkpoints').iterdir()) == []


def _cell_with_config(path, config, rounds=10):
  path.mkdir(parents=True)
  (path / 'summary.json').write_text(json.dumps({
      'config': experiment.config_to_json(config),
      'final_round': {'round': rounds}}))
  return str(path)


def test_needs_run_refuses_a_cell_run_with_other_hyperparameters(tmp_path):
  base = experiment.ExperimentConfig(rounds=10)
  _, ran = grid.cell_config(base, 'fedprox:mu=0.01')
  cell = _cell_with_config(tmp_path / 'fedprox', ran)
  name, same = grid.cell_config(base, 'fedprox', {'mu': 0.01})
  assert (name, same.algorithm_params) == ('fedprox', ran.algorithm_params)
  assert not grid.needs_run(cell, 10, config=same)
  _, other = grid.cell_config(base, 'fedprox', {'mu': 1.0})
  with pytest.raises(ValueError, match=r"ran with algorithm_params "
                     r"\{'fedprox': \{'mu': 0.01\}\}, not the "
                     r"\{'fedprox': \{'mu': 1.0\}\}"):
    grid.needs_run(cell, 10, config=other)
  assert (tmp_path / 'fedprox' / 'summary.json').exists()   # untouched
  # Without a config (or a summary without one) no check.
  assert not grid.needs_run(cell, 10)


def test_needs_run_refuses_a_cell_run_with_another_setting(tmp_path):
  base = experiment.ExperimentConfig(rounds=10, learning_rate=0.01)
  _, cfg = grid.cell_config(base, 'fedavg')
  cell = _cell_with_config(tmp_path / 'fedavg', cfg)
  # Run-time knobs may differ; the data, model and training may not.
  knobs = dataclasses.replace(cfg, eval_every=5, data_dir='/elsewhere',
                              max_concurrent_clients=2)
  assert not grid.needs_run(cell, 10, config=knobs)
  for change, message in (
      (dict(learning_rate=0.05),
       'learning_rate: ran with 0.01, asked for 0.05'),
      (dict(local_epochs=5, batch_size=50),
       'batch_size: ran with 10, asked for 50; local_epochs: ran with 1, '
       'asked for 5'),
      (dict(partition_params={'alpha': 0.1}),
       "partition_params: ran with {'alpha': 0.5}, asked for {'alpha': 0.1}"),
  ):
    with pytest.raises(ValueError, match=re.escape(
        f'ran with another configuration ({message})')):
      grid.needs_run(cell, 10, config=dataclasses.replace(cfg, **change))
  # A field the summary does not record (written before it existed) counts
  # as its default.
  old = json.loads((tmp_path / 'fedavg' / 'summary.json').read_text())
  del old['config']['weight_decay']
  (tmp_path / 'fedavg' / 'summary.json').write_text(json.dumps(old))
  assert not grid.needs_run(cell, 10, config=cfg)
  with pytest.raises(ValueError, match='weight_decay: ran with 0.0'):
    grid.needs_run(cell, 10,
                   config=dataclasses.replace(cfg, weight_decay=1e-5))


def test_needs_run_refuses_to_run_a_fedpsd_cell_on_to_more_rounds(tmp_path):
  # FedPSD's alpha = t / total_rounds: a 10-round cell is not the first
  # 10 rounds of a 20-round one. Other methods resume to more rounds.
  base = experiment.ExperimentConfig(rounds=10)
  for method in ('fedpsd', 'fedavg'):
    _, cfg = grid.cell_config(base, method)
    cell = _cell_with_config(tmp_path / method, cfg)
    longer = dataclasses.replace(cfg, rounds=20)
    if method == 'fedavg':
      assert grid.needs_run(cell, 20, config=longer)
    else:
      with pytest.raises(ValueError,
                         match=re.escape('rounds: ran with 10, asked for 20')):
        grid.needs_run(cell, 20, config=longer)


def test_needs_run_refuses_a_cell_of_another_model_architecture(tmp_path):
  cell = tmp_path / 'fedavg'
  cell.mkdir()
  (cell / 'summary.json').write_text(json.dumps({
      'model_architecture': '3ea9ac0cc54eb5dc', 'final_round': {'round': 10}}))
  assert not grid.needs_run(str(cell), 10, architecture='3ea9ac0cc54eb5dc')
  with pytest.raises(ValueError, match="ran with model architecture "
                     "'3ea9ac0cc54eb5dc', but this code builds "
                     "'0123456789abcdef'"):
    grid.needs_run(str(cell), 10, architecture='0123456789abcdef')
  assert (cell / 'summary.json').exists()      # nothing was touched
  # A summary written before architectures were recorded is accepted.
  old = _finished_cell(tmp_path / 'old', 10, {})
  assert not grid.needs_run(str(old), 10, architecture='0123456789abcdef')


def test_method_params_spec_overrides_defaults():
  assert grid.method_params('moon', {'mu': 0.1}) == ('moon', {'mu': 0.1})
  base = experiment.ExperimentConfig()
  name, cfg = grid.cell_config(base, 'moon:mu=5',
                               {'mu': 0.1, 'temperature': 0.5})
  assert (name, cfg.algorithm_params) == (
      'moon', {'moon': {'mu': 5, 'temperature': 0.5}})
  assert base.algorithm_params == {}           # a copy; the base is kept
  assert grid.cell_config(base, 'fedavg')[1].algorithm_params == {
      'fedavg': {}}
  assert grid.method_params('moon:mu=5;temperature=1', {'mu': 0.1}) == (
      'moon', {'mu': 5, 'temperature': 1})


def test_method_and_encoder_specs_are_parsed_and_checked():
  assert grid.parse_method('fedpsd:psd=false;rhpk=true') == (
      'fedpsd', {'psd': False, 'rhpk': True})
  assert grid.parse_encoder('resnet10:width=0.25') == (
      'resnet10', {'width': 0.25})
  assert grid.parse_encoder('vgg11') == ('vgg11', {})
  for text, message in (
      ('fedsgd', "unknown method 'fedsgd'; known: ["),
      ('moon:mu', "method parameter 'mu' of 'moon:mu' must be key=value"),
      ('moon:mu=one', "value of mu in 'moon:mu=one' is not JSON"),
      ('moon:mu_=1', "'moon:mu_=1': moon does not take ['mu_']"),
  ):
    with pytest.raises(app.UsageError, match=re.escape(message)):
      grid.parse_method(text)
  for text, message in (
      ('resnet34', "unknown encoder 'resnet34'; known: ["),
      ('vgg11:depth=11', "'vgg11:depth=11': encoder 'vgg11' got unknown "
       'option(s) depth'),
      ('resnet10:width', "encoder parameter 'width' of 'resnet10:width'"),
  ):
    with pytest.raises(app.UsageError, match=re.escape(message)):
      grid.parse_encoder(text)


def test_mean_std_marks_a_single_seed():
  assert grid.mean_std([]) == '-'
  assert grid.mean_std([0.5]) == '50.00 (1 seed)'
  assert grid.mean_std([0.5, 0.7]) == '60.00 ± 10.00'


def _tff_workers() -> dict[int, list[str]]:
  """This process's TFF workers: pid -> command line."""
  workers = {}
  for p in runtime._workers():  # pylint: disable=protected-access
    try:
      workers[p.pid] = p.cmdline()
    except psutil.Error:
      continue
  return workers


def test_each_cell_runs_in_a_fresh_tff_worker(tmp_path):
  # One worker keeps memory from every cell it ran (BUILD_NOTES, "Worker
  # memory"): a cell's worker must end with it, and the next cell start
  # its own.
  config = experiment.ExperimentConfig(dataset='iris', num_clients=3,
                                       clients_per_round=3, rounds=1)
  data = experiment.prepare(config)
  seen = []
  try:
    # The second cell caps the worker: the fresh worker must get the cap.
    for method, cap in (('fedavg', None), ('moon', 1)):
      grid.run_cell(dataclasses.replace(config, max_concurrent_clients=cap),
                    data, method, str(tmp_path / method),
                    checkpoint_every=1,
                    after=lambda result, out: seen.append(_tff_workers()))
      assert not _tff_workers(), f'{method} left its worker running'
      assert (tmp_path / method / 'summary.json').exists()
  finally:
    runtime.ensure_context()   # for the tests after this one
  assert len(seen) == 2 and all(len(w) == 1 for w in seen), seen
  assert seen[0].keys() != seen[1].keys()
  worker_flags = [' '.join(*w.values()) for w in seen]
  cap = '--max_concurrent_computation_calls=1'
  assert cap not in worker_flags[0], worker_flags[0]
  assert cap in worker_flags[1], worker_flags[1]


def test_a_cell_that_raises_still_ends_its_tff_worker(tmp_path):
  config = experiment.ExperimentConfig(dataset='iris', num_clients=3,
                                       clients_per_round=3, rounds=1)
  data = experiment.prepare(config)

  def after(result, out):
    assert _tff_workers(), 'the cell ran without a TFF worker'
    raise RuntimeError('figure dump failed')

  try:
    with pytest.raises(RuntimeError, match='figure dump failed'):
      grid.run_cell(config, data, 'fedavg', str(tmp_path / 'fedavg'),
                    checkpoint_every=1, after=after)
    assert not _tff_workers(), 'the failed cell left its worker running'
    assert (tmp_path / 'fedavg' / 'summary.json').exists()
  finally:
    runtime.ensure_context()   # for the tests after this one


def test_prepare_turns_input_errors_into_usage_errors_and_keeps_bugs(
    monkeypatch):
  config = experiment.ExperimentConfig(dataset='iris', num_clients=3,
                                       clients_per_round=3)
  assert grid.prepare(config).partition.num_clients == 3
  with pytest.raises(app.UsageError, match="Unknown data set 'irs'"):
    grid.prepare(dataclasses.replace(config, dataset='irs'))
  with pytest.raises(app.UsageError, match="Unknown encoder 'mlpp'"):
    grid.prepare(dataclasses.replace(config, model='mlpp'))
  # A ValueError raised inside a library is not input to fix: it keeps
  # its type and traceback.
  def broken(config):
    del config
    return np.reshape(np.zeros(3), (2, 2))

  monkeypatch.setattr(grid.experiment, 'prepare', broken)
  with pytest.raises(ValueError, match='cannot reshape') as raised:
    grid.prepare(config)
  assert not isinstance(raised.value, app.UsageError)


def test_eval_logger_prints_one_line_per_evaluation(capsys):
  log = grid.eval_logger('cell', 200)
  log(3, {'train_loss': 0.5, 'round_seconds': 4.0})       # no evaluation
  log(10, {'train_loss': 0.51234, 'round_seconds': 4.25,
           'test/personal/accuracy_mean': 0.612345})
  log(20, {'train_loss': 1.0, 'round_seconds': 1.0,
           'test/personal/mae_mean': 2.5})
  assert capsys.readouterr().out.splitlines() == [
      'cell round 10/200: train_loss 0.512 personalized acc 0.6123 (4.2s)',
      'cell round 20/200: train_loss 1.000 personalized MAE 2.5000 (1.0s)']


def test_fig9_bars_mark_a_mean_over_fewer_seeds_than_asked():
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  accs = {('fedavg', 'cnn'): [50.0, 70.0, 60.0],
          ('fedavg', 'resnet'): [40.0, 44.0],
          ('afedcl', 'cnn'): [80.0],
          ('afedcl', 'resnet'): []}
  fig, ax = plt.subplots()
  grid.draw_seed_bars(ax, accs, ['fedavg', 'afedcl'],
                      ['cnn', 'resnet'], n_seeds=3)
  bars = list(ax.patches)
  # Three bars: the cell with no finished seed draws none.
  assert [round(b.get_height(), 2) for b in bars] == [60.0, 42.0, 80.0]
  assert [b.get_hatch() for b in bars] == [None, '///', '///']
  assert sorted(t.get_text() for t in ax.texts) == ['1/3', '2/3']
  # The full seed count marks nothing.
  fig2, ax2 = plt.subplots()
  grid.draw_seed_bars(ax2, accs, ['fedavg', 'afedcl'],
                      ['cnn', 'resnet'], n_seeds=1)
  assert not ax2.texts and all(p.get_hatch() is None for p in ax2.patches)
  plt.close(fig)
  plt.close(fig2)


def test_draw_seed_line_marks_points_over_fewer_seeds():
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  points = [(1, [10.0, 20.0]), (3, [30.0]), (5, [])]
  fig, ax = plt.subplots()
  assert grid.draw_seed_line(ax, points, n_seeds=2, label='fedavg')
  line, hollow = ax.lines
  # The line leaves out the x with no finished seed.
  assert list(line.get_xdata()) == [1, 3]
  assert list(line.get_ydata()) == [15.0, 30.0]
  assert line.get_label() == 'fedavg'
  # The one-seed point is drawn again, hollow, with no text to overprint.
  assert (list(hollow.get_xdata()), list(hollow.get_ydata())) == ([3], [30.0])
  assert hollow.get_markerfacecolor() == 'white'
  assert hollow.get_markeredgecolor() == line.get_color()
  assert not ax.texts
  # The next line takes the next colour of the cycle.
  assert not grid.draw_seed_line(ax, [(1, [5.0, 6.0])], n_seeds=2,
                                 label='fedntd')
  assert matplotlib.colors.same_color(line.get_color(), 'C0')
  assert matplotlib.colors.same_color(ax.lines[-1].get_color(), 'C1')
  # The legend entry that explains the hollow marker names the seeds asked.
  handle = grid.partial_seeds_handle(3)
  assert handle.get_markerfacecolor() == 'white'
  assert 'fewer than 3 seeds' in handle.get_label()
  # The full seed count marks nothing; no finished seed draws nothing.
  fig2, ax2 = plt.subplots()
  assert not grid.draw_seed_line(ax2, points, n_seeds=1, label='fedavg')
  assert not grid.draw_seed_line(ax2, [(1, [])], n_seeds=1, label='fedntd')
  assert len(ax2.lines) == 1
  plt.close(fig)
  plt.close(fig2)


def test_warn_methods_beyond_only_when_narrowed_methods_leave_some_out(
    caplog):
  fv = flags.FlagValues()
  flags.DEFINE_list('methods', ['a', 'b', 'c'], '', flag_values=fv)
  flags.DEFINE_list('sweep_methods', ['b', 'c'], '', flag_values=fv)
  flags.DEFINE_list('sweep_settings', ['s'], '', flag_values=fv)

  def warnings(argv, methods=None, choosers=('sweep_methods',)):
    fv.unparse_flags()
    fv(['prog'] + argv)
    caplog.clear()
    grid.warn_methods_beyond(fv, 'Fig. 9', choosers,
                             fv.sweep_methods if methods is None else methods)
    return [r.getMessage() for r in caplog.records
            if r.levelname == 'WARNING']

  found = warnings(['--methods=b'])
  assert found == ['Fig. 9: uses c, not in --methods (--methods does not '
                   'limit this part; give --sweep_methods to choose).']
  assert not warnings([])                                # nothing narrowed
  assert not warnings(['--methods=c,b'])                 # covers them all
  assert not warnings(['--methods=a', '--sweep_methods=b,c'])  # chosen
  # The methods the part uses need not be the flags' own values (FedPSD's
  # Table VI runs FedAvg and FedPSD besides its variants); each is named
  # once.
  assert warnings(['--methods=a'], ['a', 'd', 'e', 'd']) == [
      'Fig. 9: uses d, e, not in --methods (--methods does not limit this '
      'part; give --sweep_methods to choose).']
  # A part chosen by several flags: any one given is a choice.
  both = ('sweep_methods', 'sweep_settings')
  assert warnings(['--methods=b'], choosers=both) == [
      'Fig. 9: uses c, not in --methods (--methods does not limit this '
      'part; give --sweep_methods or --sweep_settings to choose).']
  assert not warnings(['--methods=b', '--sweep_settings=t'], choosers=both)
  assert not warnings(['--methods=b', '--sweep_methods=b,c'], choosers=both)
