"""End-to-end test of the AFedCL grid program on the embedded digits."""

import json
import re

from programs import grid
from tests.programs import conftest


def _run(args, timeout=600):
  return conftest.run_program('programs.afedcl_tables', args, timeout)


def test_grid_writes_table_and_figures_and_resumes(tmp_path):
  args = ['--dataset=digits', '--partitions=disjoint:3', '--shots=10',
          '--seeds=0,1', '--methods=afedcl,fedavg',
          '--ablation=', '--rounds=1', '--local_epochs=1',
          '--tsne_methods=afedcl,fedavg', '--client_counts=2',
          '--total_samples=20', '--sweep_methods=fedavg',
          '--model=mlp', '--optimizer=sgd', '--learning_rate=0.05',
          '--lambdas=0.5',
          '--eval_every=1', f'--output_dir={tmp_path}']
  proc = _run(args)
  assert proc.returncode == 0, proc.stdout[-3000:]
  # 2 seeds x (2 methods + AFedCL and Ditto at lambda 0.5), plus fedavg
  # with 2 clients x 10 shots x 2 seeds.
  assert len(re.findall(r'^\S+: personalized acc', proc.stdout,
                        re.MULTILINE)) == 10
  # With one round, each cell's one evaluation is logged once.
  assert len(re.findall(r'^\S+ round 1/1: train_loss ', proc.stdout,
                        re.MULTILINE)) == 10
  table = (tmp_path / 'table2.md').read_text()
  assert '| afedcl |' in table and '| fedavg |' in table
  assert 'n=2' in table and 'Missing' not in table
  csv = (tmp_path / 'table2.csv').read_text().splitlines()
  assert csv[0].startswith('method,partition,shots,acc_mean')
  assert len(csv) == 3
  for fig in ('fig4_discrimination.png', 'fig5_ld_vs_fusion.png',
              'fig7_tsne.png', 'fig8_lambda.png', 'fig9b_clients.png',
              'fig10_ablation.png'):
    assert (tmp_path / fig).stat().st_size > 1000
  assert 'F1 ' in table and table.count('±') == 4   # acc and F1, 2 methods
  rounds = (tmp_path / 'disjoint_3_k10' / 'seed0' / 'afedcl' /
            'rounds.csv').read_text().splitlines()
  assert 'train/discrimination_accuracy_client_mean' in rounds[0]
  # The lambda sweep runs at every seed (Fig. 8 shows mean +/- std).
  assert (tmp_path / 'disjoint_3_k10' / 'seed1' /
          grid.safe_name('ditto:lambda_=0.5') / 'summary.json').exists()
  cell = tmp_path / 'disjoint_3_k10' / 'seed1' / 'afedcl'
  assert (cell / 'afedcl_clients.json').exists()
  features = tmp_path / 'disjoint_3_k10' / 'seed0' / 'afedcl' / 'features.npz'
  assert features.exists() and not (cell / 'features.npz').exists()
  assert (tmp_path / 'disjoint_3_k10_K2' / 'seed1' / 'fedavg' /
          'summary.json').exists()
  # A second call finds every cell finished and trains nothing (a
  # concurrency cap is a memory knob: it does not make a cell stale).
  again = _run(args + ['--max_concurrent_clients=1'])
  assert again.returncode == 0, again.stdout[-3000:]
  assert 'personalized acc' not in again.stdout
  # ... but not when AFedCL's lambda changed: the finished cell is not
  # taken for a run at the new lambda.
  other = _run(args + ['--afedcl_lambda=0.7'])
  assert other.returncode != 0
  assert "not the {'afedcl': {'lambda_': 0.7, 'seed': 0}}" in other.stdout, (
      other.stdout[-3000:])
  # --write_only with a seed that never ran: nothing trains, the table
  # lists the missing cells.
  more = [a if not a.startswith('--seeds') else '--seeds=0,1,2'
          for a in args]
  written = _run(more + ['--write_only'])
  assert written.returncode == 0, written.stdout[-3000:]
  assert 'personalized acc' not in written.stdout
  missing = (tmp_path / 'table2.md').read_text().split('Missing runs:')[1]
  assert 'afedcl disjoint:3 k=10 seed=2' in missing
  # One seed has no spread: its cells say so instead of '± 0.00'.
  one = [a if not a.startswith('--seeds') else '--seeds=1' for a in args]
  single = _run(one + ['--write_only'])
  assert single.returncode == 0, single.stdout[-3000:]
  table = (tmp_path / 'table2.md').read_text()
  assert table.count('1 seed') == 2 and '±' not in table


def test_fig9_writes_the_plotted_values_as_markdown(tmp_path):
  # Finished cells planted as summaries; --write_only trains nothing.
  accs = {('disjoint_3_k10', 0): 0.50, ('disjoint_3_k10', 1): 0.70,
          ('disjoint_3_k10_resnet10_width=0.5', 0): 0.40,
          ('disjoint_3_k10_K2', 0): 0.30, ('disjoint_3_k10_K2', 1): 0.20}
  for (folder, seed), acc in accs.items():
    cell = tmp_path / folder / f'seed{seed}' / 'fedavg'
    cell.mkdir(parents=True)
    (cell / 'summary.json').write_text(json.dumps({'final_round': {
        'round': 1, 'personal/accuracy_mean': acc,
        'personal/macro_f1_mean': acc}}))
  # Seed 2 never ran: the two-seed cells say they lack one.
  proc = _run(['--dataset=digits', '--partitions=disjoint:3', '--shots=10',
               '--seeds=0,1,2', '--methods=fedavg', '--sweep_methods=fedavg',
               '--model=mlp', '--backbones=resnet10:width=0.5',
               '--client_counts=2',
               '--total_samples=20', '--rounds=1', '--write_only',
               f'--output_dir={tmp_path}'], timeout=300)
  assert proc.returncode == 0, proc.stdout[-3000:]
  assert 'personalized acc' not in proc.stdout
  fig9a = (tmp_path / 'fig9a_backbones.md').read_text().splitlines()
  assert fig9a[:3] == [
      '| method | mlp | resnet10:width=0.5 |', '|---|---|---|',
      '| fedavg | 60.00 ± 10.00 (2 of 3 seeds) | 40.00 (1 seed) |']
  # Table II marks its two-seed mean the same way.
  table2 = (tmp_path / 'table2.md').read_text().splitlines()
  assert table2[2] == ('| fedavg | 60.00 ± 10.00 (F1 60.00 ± 10.00; '
                       '2 of 3 seeds) |')
  assert 'fedavg disjoint:3 k=10 seed=2' in table2[-1]
  fig9b = (tmp_path / 'fig9b_clients.md').read_text().splitlines()
  assert fig9b[:3] == ['| method | 2 |', '|---|---|',
                       '| fedavg | 25.00 ± 5.00 (2 of 3 seeds) |']
  for fig in ('fig9a_backbones.png', 'fig9b_clients.png'):
    assert (tmp_path / fig).stat().st_size > 1000
  # A narrowed --methods with Fig. 9 asked for (an encoder other than
  # --model) and --sweep_methods, --tsne_methods and --ablation left
  # alone: the program says which parts use other methods.
  common = ['--dataset=digits', '--partitions=disjoint:3', '--shots=10',
            '--seeds=0', '--methods=afedcl', '--model=mlp', '--write_only']
  narrowed = _run(common + ['--backbones=mlp,resnet10:width=0.5',
                            f'--output_dir={tmp_path / "narrowed"}'],
                  timeout=300)
  assert narrowed.returncode == 0, narrowed.stdout[-3000:]
  for part in ('Fig. 9: uses fedavg, fedrep, fedala, not in --methods '
               '(--methods does not limit this part; give --sweep_methods '
               'to choose).',
               'Fig. 7 (t-SNE): uses fedavg, fedrep, fedala, not in '
               '--methods (--methods does not limit this part; give '
               '--tsne_methods to choose).',
               'Figs. 4 and 10 (ablation): uses afedcl:dcc=0, afedcl:caa=0, '
               'afedcl:aff=0, not in --methods'):
    assert part in narrowed.stdout, (part, narrowed.stdout[-3000:])
  # Client counts alone ask for Fig. 9 too.
  counts = _run(common + ['--client_counts=2', '--total_samples=20',
                          f'--output_dir={tmp_path / "counts"}'],
                timeout=300)
  assert counts.returncode == 0, counts.stdout[-3000:]
  assert 'Fig. 9: uses fedavg,' in counts.stdout, counts.stdout[-3000:]
  # ... and nothing of Fig. 9 when it has no cell of its own (its only
  # backbone is --model, and there are no client counts), nor of parts
  # whose methods were chosen.
  same = _run(common + ['--backbones=mlp', '--tsne_methods=afedcl,fedavg',
                        '--ablation=afedcl:dcc=0',
                        f'--output_dir={tmp_path / "same"}'], timeout=300)
  assert same.returncode == 0, same.stdout[-3000:]
  assert 'not in --methods' not in same.stdout, same.stdout[-3000:]
  # A backbone option its encoder does not take is refused up front.
  bad = _run(['--dataset=digits', '--backbones=resnet10:depth=10',
              '--write_only', f'--output_dir={tmp_path}'], timeout=300)
  assert bad.returncode != 0
  assert "encoder 'resnet10' got unknown option(s) depth" in bad.stdout, (
      bad.stdout[-2000:])
  unknown = _run(['--dataset=neu', '--write_only',
                  f'--output_dir={tmp_path / "never"}'], timeout=300)
  assert unknown.returncode != 0
  assert "Unknown data set 'neu'; known: [" in unknown.stdout
  assert not (tmp_path / 'never').exists()


def test_checkpoint_spacing_is_a_flag_not_part_of_the_cell(tmp_path):
  conftest.check_checkpoint_spacing(
      'programs.afedcl_tables',
      ['--dataset=digits', '--partitions=disjoint:3', '--shots=10',
       '--seeds=0', '--methods=afedcl', '--ablation=', '--tsne_methods=',
       '--sweep_methods=', '--local_epochs=1', '--model=mlp',
       '--optimizer=sgd', '--learning_rate=0.05', '--eval_every=3',
       f'--output_dir={tmp_path}'],
      tmp_path / 'disjoint_3_k10' / 'seed0' / 'afedcl')
