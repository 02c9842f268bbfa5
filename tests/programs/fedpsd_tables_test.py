"""End-to-end test of the FedPSD grid program on the embedded digits."""

import json
import os
import re
import subprocess
import sys

import pandas as pd
import pytest

from tests.programs import conftest


def _run(args, timeout=900):
  return conftest.run_program('programs.fedpsd_tables', args, timeout)


def test_grid_writes_tables_and_resumes(tmp_path):
  args = ['--settings=digits:shards=2', '--seeds=0', '--augment=none',
          '--methods=fedavg,fedpsd', '--ablation=fedpsd:psd=false',
          '--ablation_settings=digits:shards=2',
          '--architecture_methods=fedavg', '--sweep_methods=fedavg',
          '--architectures=resnet10:width=0.25',
          '--architecture_setting=digits:shards=2',
          '--epoch_sweep=1', '--participation_sweep=1.0',
          '--num_clients=6', '--participation_rate=0.5', '--rounds=2',
          '--local_epochs=2', '--batch_size=10', '--model=mlp',
          '--learning_rate=0.05', '--eval_every=1',
          f'--output_dir={tmp_path}']
  proc = _run(args)
  assert proc.returncode == 0, proc.stdout[-3000:]
  # fedavg, fedpsd, the ablation variant, and fedavg with ResNet-10, with 1
  # local epoch and with every client sampled.
  assert len(re.findall(r'^\S+: personalized acc', proc.stdout,
                        re.MULTILINE)) == 6
  # A log line per evaluation round of each cell (--eval_every=1).
  assert len(re.findall(r'^\S+ round [12]/2: train_loss \d+\.\d+ '
                        r'personalized acc [01]\.\d{4} \(', proc.stdout,
                        re.MULTILINE)) == 12
  table1 = (tmp_path / 'table1.md').read_text()
  assert '| fedpsd |' in table1 and 'Missing' not in table1
  assert 'No setting' in (tmp_path / 'table2.md').read_text()
  table6 = (tmp_path / 'table6.md').read_text()
  # FedAvg, the --ablation variants, full FedPSD (Table VI's row order).
  assert [line.split('|')[1].strip() for line in table6.splitlines()
          if line.startswith('| fed')] == ['fedavg', 'fedpsd:psd=false',
                                           'fedpsd']
  rows = (tmp_path / 'table4.csv').read_text().splitlines()
  assert rows[0] == 'method,column,value,std,n'
  # Each method's value is the first evaluated round whose average client
  # accuracy reaches FedAvg's final one (FedAvg reaches its own, at the
  # latest in the last round); a method that never does has no CSV row.
  table4 = {r.split(',')[0]: float(r.split(',')[2]) for r in rows[1:]}
  key = 'local_pooled/accuracy_mean'
  target = json.loads((tmp_path / 'digits_shards=2' / 'seed0' / 'fedavg'
                       / 'summary.json').read_text())['final_round'][key]
  for method in ('fedavg', 'fedpsd'):
    curve = pd.read_csv(tmp_path / 'digits_shards=2' / 'seed0' / method
                        / 'rounds.csv').dropna(subset=[f'test/{key}'])
    hits = curve[curve[f'test/{key}'] >= target - 1e-12]['round']
    if method == 'fedavg' or len(hits):
      assert table4[method] == hits.iloc[0], method
    else:
      assert method not in table4
  assert (tmp_path / 'fig3_curves_digits_shards=2.png').stat().st_size > 1000
  table7 = (tmp_path / 'table7.md').read_text()
  assert '| method | mlp | resnet10:width=0.25 |' in table7
  assert '| fedavg |' in table7 and 'Missing' not in table7
  # The encoder's options reach the model: a quarter-width ResNet-10.
  arch_cell = (tmp_path / 'digits_shards=2_resnet10_width=0.25' / 'seed0'
               / 'fedavg' / 'summary.json')
  config = json.loads(arch_cell.read_text())['config']
  assert (config['model'], config['model_options']) == (
      'resnet10', {'width': 0.25})
  for fig in ('fig4_local_epochs.png', 'fig5_participation.png'):
    assert (tmp_path / fig).stat().st_size > 1000
  # The figures' numbers: the main grid's value (2 epochs, rate 0.5) and
  # the swept one, client and global readings, from different cells.
  for name, columns in (('fig4_local_epochs', '| 1 | 2 |'),
                        ('fig5_participation', '| 0.5 | 1 |')):
    for suffix in ('', '_global'):
      text = (tmp_path / f'{name}{suffix}.md').read_text()
      assert f'| method {columns}' in text and 'Missing' not in text
      rows = (tmp_path / f'{name}{suffix}.csv').read_text().splitlines()
      assert [r.split(',')[:2] for r in rows[1:]] == [
          ['fedavg', c] for c in columns.strip('| ').split(' | ')]
  epochs = {r.split(',')[1]: float(r.split(',')[2]) for r in
            (tmp_path / 'fig4_local_epochs.csv').read_text().splitlines()[1:]}
  e1 = json.loads((tmp_path / 'digits_shards=2_E1' / 'seed0' / 'fedavg'
                   / 'summary.json').read_text())['final_round']
  assert epochs['1'] == e1['local_pooled/accuracy_mean']
  cell = tmp_path / 'digits_shards=2' / 'seed0' / 'fedpsd'
  assert (cell / 'summary.json').exists()
  final = json.loads((cell / 'summary.json').read_text())['final_round']
  assert 0 <= final['local/accuracy_mean'] <= 1
  assert 0 <= final['local_pooled/accuracy_mean'] <= 1
  assert '(local_pooled)' in table1
  assert (tmp_path / 'table1_local_pooled.md').read_text() == table1
  for protocol in ('local', 'personal'):
    other = (tmp_path / f'table1_{protocol}.md').read_text()
    assert f'({protocol})' in other and '| fedpsd |' in other
  # A second call finds every cell finished and trains nothing (a
  # concurrency cap is a memory knob: it does not make a cell stale).
  again = _run(args + ['--max_concurrent_clients=1'])
  assert again.returncode == 0, again.stdout[-3000:]
  assert 'personalized acc' not in again.stdout
  # Another training setting on the same folder is refused, not mixed in.
  other = [a if a != '--learning_rate=0.05' else '--learning_rate=0.1'
           for a in args]
  refused = _run(other)
  assert refused.returncode != 0
  assert ('ran with another configuration (learning_rate: ran with 0.05, '
          'asked for 0.1)') in refused.stdout, refused.stdout[-3000:]
  assert 'personalized acc' not in refused.stdout
  # --write_only with a seed that never ran: nothing trains, the table
  # lists the missing cells.
  more = [a if not a.startswith('--seeds') else '--seeds=0,1' for a in args]
  written = _run(more + ['--write_only'])
  assert written.returncode == 0, written.stdout[-3000:]
  assert 'personalized acc' not in written.stdout
  missing = (tmp_path / 'table1.md').read_text().split('Missing runs:')[1]
  assert 'fedpsd digits:shards=2 seed=1' in missing
  missing = (tmp_path / 'fig4_local_epochs.md').read_text()
  assert 'fedavg digits:shards=2 E1 seed=1' in missing.split('Missing runs:')[1]
  # --final_evals=2 reads each cell as the mean of its last two evaluations
  # (rounds 1 and 2 here); a cell with fewer is listed as missing.
  windowed = _run(args + ['--write_only', '--final_evals=2'])
  assert windowed.returncode == 0, windowed.stdout[-3000:]
  table1 = (tmp_path / 'table1.md').read_text()
  assert 'mean of the last 2 evaluations' in table1
  values = {r.split(',')[0]: float(r.split(',')[2]) for r in
            (tmp_path / 'table1.csv').read_text().splitlines()[1:]}
  curve = pd.read_csv(cell / 'rounds.csv').dropna(
      subset=['test/personal/accuracy_mean'])
  assert list(curve['round']) == [1, 2]
  assert values['fedpsd'] == pytest.approx(
      curve['test/local_pooled/accuracy_mean'].mean())
  too_many = _run(args + ['--write_only', '--final_evals=3'])
  assert too_many.returncode == 0, too_many.stdout[-3000:]
  missing = (tmp_path / 'table1.md').read_text().split('Missing runs:')[1]
  assert ('fedpsd digits:shards=2 seed=0 (fewer than 3 evaluations of '
          'local_pooled/accuracy_mean)') in missing


def test_checkpoint_spacing_is_a_flag_not_part_of_the_cell(tmp_path):
  conftest.check_checkpoint_spacing(
      'programs.fedpsd_tables',
      ['--settings=digits:shards=2', '--seeds=0', '--augment=none',
       '--methods=fedavg', '--ablation_settings=', '--num_clients=6',
       '--participation_rate=0.5', '--local_epochs=1', '--batch_size=10',
       '--model=mlp', '--learning_rate=0.05', '--eval_every=3',
       f'--output_dir={tmp_path}'],
      tmp_path / 'digits_shards=2' / 'seed0' / 'fedavg')


def test_sweep_values_are_checked_and_no_setting_still_writes(tmp_path):
  for flag, message in (('--epoch_sweep=1,2.5', "got '2.5'"),
                        ('--participation_sweep=0', "got '0'"),
                        ('--architectures=vgg11:width=0.5;depth=8',
                         "encoder 'vgg11' got unknown option(s) depth"),
                        ('--ablation_settings=digts:shards=2',
                         "Unknown data set 'digts'; known: [")):
    proc = _run(['--settings=digits:shards=2', flag, '--write_only',
                 f'--output_dir={tmp_path}'])
    assert proc.returncode != 0
    assert message in proc.stdout, proc.stdout[-2000:]
    assert 'Traceback' not in proc.stdout
  # Refused before anything is written.
  assert not tmp_path.exists() or not any(tmp_path.iterdir())
  # Tables with no setting at all (no sweep given): written, saying so.
  proc = _run(['--settings=', '--ablation_settings=', '--write_only',
               f'--output_dir={tmp_path}'])
  assert proc.returncode == 0, proc.stdout[-3000:]
  assert 'No setting' in (tmp_path / 'table1.md').read_text()
  assert not (tmp_path / 'fig4_local_epochs.md').exists()


def test_baselines_take_fedntd_config_values_and_old_cells_are_refused(
    tmp_path):
  # Every BASELINE_PARAMS entry is a real keyword of its builder (a typo
  # would only fail hours into a grid).
  check = ('import inspect; from programs import fedpsd_tables as t; '
           'from programs import grid; '
           'from tff_pfl.algorithms import registry as r; '
           'bad = {m: sorted(set(p) - set(inspect.signature('
           'r.ALGORITHMS[m].build).parameters)) '
           'for m, p in t.BASELINE_PARAMS.items()}; '
           'print("unknown", bad); '
           'from tff_pfl import experiment as e; '
           'params = lambda m: grid.cell_config(e.ExperimentConfig(), m, '
           't.defaults(m))[1].algorithm_params; '
           'assert params("fedprox") == {"fedprox": {"mu": 1.0}}; '
           'assert params("moon:mu=5") == '
           '{"moon": {"mu": 5, "temperature": 0.5}}')
  proc = subprocess.run(
      [sys.executable, '-c', check], cwd=conftest.ROOT, capture_output=True,
      text=True, timeout=300,
      env=dict(os.environ, PYTHONPATH=str(conftest.ROOT)))
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "unknown {'fedprox': [], 'moon': []}" in proc.stdout
  # A finished FedProx cell run with the library default mu = 0.01 is not
  # taken for this grid's mu = 1.0 one.
  cell = tmp_path / 'digits_shards=2' / 'seed0' / 'fedprox'
  cell.mkdir(parents=True)
  (cell / 'summary.json').write_text(json.dumps({
      'config': {'algorithm_params': {'fedprox': {}}},
      'final_round': {'round': 2}}))
  args = ['--settings=digits:shards=2', '--seeds=0', '--methods=fedprox',
          '--ablation_settings=', '--rounds=2', '--model=mlp',
          f'--output_dir={tmp_path}']
  proc = _run(args)
  assert proc.returncode != 0
  assert ("ran with algorithm_params {'fedprox': {}}, not the "
          "{'fedprox': {'mu': 1.0}} asked for") in proc.stdout, (
              proc.stdout[-2000:])
  # Nor is one whose model was built differently (another architecture).
  (cell / 'summary.json').write_text(json.dumps({
      'config': {'algorithm_params': {'fedprox': {'mu': 1.0}}},
      'model_architecture': '0123456789abcdef',
      'final_round': {'round': 2}}))
  proc = _run(args)
  assert proc.returncode != 0
  assert ("ran with model architecture '0123456789abcdef', but this code "
          "builds") in proc.stdout, proc.stdout[-2000:]


def test_fig3_curves_average_seeds_over_the_rounds_they_share(tmp_path):
  from absl import flags  # pylint: disable=g-import-not-at-top
  from absl.testing import flagsaver  # pylint: disable=g-import-not-at-top
  from programs import fedpsd_tables  # pylint: disable=g-import-not-at-top
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()
  key = 'global/accuracy_weighted'
  with flagsaver.flagsaver(output_dir=str(tmp_path)):
    # Seed 0 evaluated rounds 10-30, seed 1 stopped after 20 (round 15 not
    # evaluated), seed 2 has no cell.
    for seed, values in ((0, [0.1, 0.2, 0.3]), (1, [0.3, None, 0.4])):
      cell = fedpsd_tables.cell_dir('digits:shards=2', seed, 'fedavg')
      os.makedirs(cell)
      rounds = [10, 20, 30] if seed == 0 else [10, 15, 20]
      pd.DataFrame({
          'round': rounds,
          'test/personal/accuracy_mean': [v if v is None else 0.5
                                          for v in values],
          f'test/{key}': values,
      }).to_csv(os.path.join(cell, 'rounds.csv'), index=False)
    curves = fedpsd_tables.seed_curves('digits:shards=2', [0, 1, 2],
                                       'fedavg', key)
    assert list(curves.columns) == [0, 1]
    assert list(curves.index) == [10, 20]
    assert list(curves.mean(axis=1)) == pytest.approx([0.2, 0.3])
    assert fedpsd_tables.seed_curves('digits:shards=2', [2], 'fedavg',
                                     key) is None


def test_a_mean_over_fewer_seeds_than_asked_says_so(tmp_path):
  from absl import flags  # pylint: disable=g-import-not-at-top
  from absl.testing import flagsaver  # pylint: disable=g-import-not-at-top
  from programs import fedpsd_tables  # pylint: disable=g-import-not-at-top
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()
  key = 'local_pooled/accuracy_mean'
  with flagsaver.flagsaver(output_dir=str(tmp_path), final_evals=1):
    for seed, value in ((0, 0.5), (1, 0.7)):
      cell = fedpsd_tables.cell_dir('digits:shards=2', seed, 'fedavg')
      os.makedirs(cell)
      with open(os.path.join(cell, 'summary.json'), 'w') as f:
        json.dump({'final_round': {'round': 2, key: value}}, f)
    text, values, missing = fedpsd_tables.accuracy_cell([0, 1, 2], key)(
        'fedavg', 'digits:shards=2')
    assert text == '60.00 ± 10.00 (2 of 3 seeds)'
    assert values == [0.5, 0.7]
    assert missing == ['fedavg digits:shards=2 seed=2']
    text, _, missing = fedpsd_tables.accuracy_cell([0, 1], key)(
        'fedavg', 'digits:shards=2')
    assert text == '60.00 ± 10.00' and not missing
    # Tables IV / V: a method's rounds to FedAvg's final accuracy need
    # FedAvg's cell; the list says which cell is missing.
    cell = fedpsd_tables.cell_dir('digits:shards=2', 2, 'fedpsd')
    os.makedirs(cell)
    with open(os.path.join(cell, 'summary.json'), 'w') as f:
      json.dump({'final_round': {'round': 2, key: 0.6}}, f)
    text, _, missing = fedpsd_tables.rounds_cell([1, 2], key)(
        'fedpsd', 'digits:shards=2')
    assert text == '-'
    assert missing == ['fedpsd digits:shards=2 seed=1',
                       'fedavg digits:shards=2 seed=2 (the target)']
    # A cell missing for several rows is listed once under the table.
    cell = fedpsd_tables.cell_dir('digits:shards=2', 2, 'fedntd')
    os.makedirs(cell)
    with open(os.path.join(cell, 'summary.json'), 'w') as f:
      json.dump({'final_round': {'round': 2, key: 0.6}}, f)
    fedpsd_tables.write_table('table4', 'T', ['fedntd', 'fedpsd'],
                              ['digits:shards=2'],
                              fedpsd_tables.rounds_cell([2], key))
    assert (tmp_path / 'table4.md').read_text().splitlines()[-1] == (
        'Missing runs: fedavg digits:shards=2 seed=2 (the target)')


def test_a_narrowed_methods_flag_warns_of_the_parts_that_use_others(
    caplog):
  from absl import flags  # pylint: disable=g-import-not-at-top
  from absl.testing import flagsaver  # pylint: disable=g-import-not-at-top
  from programs import fedpsd_tables  # pylint: disable=g-import-not-at-top
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()

  def warnings(part, **overrides):
    caplog.clear()
    with flagsaver.flagsaver(**overrides):
      fedpsd_tables.warn_methods_beyond()
    return [r.getMessage() for r in caplog.records
            if r.levelname == 'WARNING' and r.getMessage().startswith(part)]

  figs = 'Fig. '
  # --methods narrowed, a sweep asked for, --sweep_methods left alone.
  found = warnings(figs, methods=['fedpsd'], epoch_sweep=['1'])
  assert found == ['Fig. 4: uses fedavg, fedntd, fedlmd, not in --methods '
                   '(--methods does not limit this part; give '
                   '--sweep_methods to choose).']
  # The same for Fig. 5, and for both.
  fig5 = warnings(figs, methods=['fedpsd'], participation_sweep=['0.2'])
  assert fig5[0].startswith('Fig. 5: uses fedavg, fedntd, fedlmd, not in')
  both = warnings(figs, methods=['fedpsd'], epoch_sweep=['1'],
                  participation_sweep=['0.2'])
  assert both[0].startswith('Fig. 4 and Fig. 5: uses fedavg,')
  # Silent: no sweep; a sweep at the main grid's value only (its cells
  # are the main grid's); --sweep_methods chosen; --methods covers them.
  assert not warnings(figs, methods=['fedpsd'])
  assert not warnings(figs, methods=['fedpsd'], epoch_sweep=['5'],
                      local_epochs=5)
  assert not warnings(figs, methods=['fedpsd'], participation_sweep=['0.1'],
                      participation_rate=0.1)
  assert not warnings(figs, methods=['fedpsd'], epoch_sweep=['1'],
                      sweep_methods=['fedpsd'])
  assert not warnings(figs, methods=['fedavg', 'fedntd', 'fedlmd', 'fedpsd',
                                     'fedprox'], epoch_sweep=['1'])
  # Default --methods: nothing was narrowed.
  assert not warnings('', epoch_sweep=['1'], architectures=['resnet10'])
  # Table VI's ablation runs by default, FedAvg and FedPSD with it.
  assert warnings('Table VI', methods=['fedpsd']) == [
      'Table VI (ablation at cifar10:shards=2,cifar10:dirichlet=0.05): uses '
      'fedavg, fedpsd:rhpk=true;psd=false;cll=false, '
      'fedpsd:rhpk=true;psd=true;cll=false, not in --methods (--methods '
      'does not limit this part; give --ablation or --ablation_settings '
      'to choose).']
  # Silent when its variants or its settings are given, none or some; an
  # empty --ablation is no ablation (no settings, FedAvg and FedPSD do not
  # run for it).
  assert not warnings('Table VI', methods=['fedpsd'], ablation=[])
  with flagsaver.flagsaver(ablation=[]):
    assert fedpsd_tables.ablation_settings() == []
  assert fedpsd_tables.ablation_settings() == [
      'cifar10:shards=2', 'cifar10:dirichlet=0.05']
  assert not warnings('Table VI', methods=['fedpsd'],
                      ablation=fedpsd_tables.ABLATION[:1])
  assert not warnings('Table VI', methods=['fedpsd'], ablation_settings=[])
  assert not warnings('Table VI', methods=['fedpsd'],
                      ablation_settings=['cifar10:shards=2'])
  # Table VII only with --architectures, and not when its methods are given.
  assert not warnings('Table VII', methods=['fedpsd'])
  assert warnings('Table VII', methods=['fedpsd'],
                  architectures=['resnet10']) == [
      'Table VII: uses fedavg, fedprox, fedcurv, fedntd, fedlmd, not in '
      '--methods (--methods does not limit this part; give '
      '--architecture_methods to choose).']
  assert not warnings('Table VII', methods=['fedpsd'],
                      architectures=['resnet10'],
                      architecture_methods=['fedavg', 'fedpsd'])


def test_sweep_figures_name_the_final_evals_reading(tmp_path, monkeypatch):
  from absl import flags  # pylint: disable=g-import-not-at-top
  from absl.testing import flagsaver  # pylint: disable=g-import-not-at-top
  from matplotlib import figure  # pylint: disable=g-import-not-at-top
  from programs import fedpsd_tables  # pylint: disable=g-import-not-at-top
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()
  titles = {}
  save = figure.Figure.savefig

  def record(fig, path, **kwargs):
    titles[os.path.basename(path)] = [ax.get_title() for ax in fig.axes]
    return save(fig, path, **kwargs)

  monkeypatch.setattr(figure.Figure, 'savefig', record)
  key = 'local_pooled/accuracy_mean'
  for final_evals, suffix in ((1, ''),
                              (5, ', mean of the last 5 evaluations')):
    with flagsaver.flagsaver(output_dir=str(tmp_path), final_evals=final_evals,
                             methods=['fedavg'], sweep_methods=['fedavg'],
                             participation_sweep=['0.2'],
                             participation_rate=0.1):
      cell = fedpsd_tables.cell_dir('digits:shards=2', 0, 'fedavg')
      os.makedirs(cell, exist_ok=True)
      with open(os.path.join(cell, 'summary.json'), 'w') as f:
        json.dump({'final_round': {'round': 2, key: 0.5}}, f)
      fedpsd_tables.write_figures(['digits:shards=2'], [0])
    assert titles['fig5_participation.png'] == ['digits:shards=2' + suffix]
