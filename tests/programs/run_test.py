"""End-to-end tests of `python -m programs.run` as a user runs it."""

import json

import pandas as pd
import pytest

from tests.programs import conftest


def _run(args, timeout=300):
  return conftest.run_program('programs.run', args, timeout)


def test_list_names_everything():
  proc = _run(['--list'])
  assert proc.returncode == 0, proc.stdout
  for name in ('fedavg', 'nofl', 'digits', 'mnist', 'dirichlet', 'shards',
               'fedavg_cnn', 'mobilenet_v2', 'resnet18'):
    assert name in proc.stdout


def test_two_algorithms_write_outputs_and_return_through_a_pipe(tmp_path):
  out = tmp_path / 'run'
  proc = _run(['--algorithm=fedavg,nofl', '--dataset=iris',
               '--partition=iid', '--num_clients=3', '--clients_per_round=2',
               '--rounds=2', '--model=mlp', '--batch_size=8',
               '--learning_rate=0.1', '--progress=false',
               f'--output_dir={out}'])
  assert proc.returncode == 0, proc.stdout[-3000:]
  assert '| fedavg |' in proc.stdout and '| nofl |' in proc.stdout
  architectures = set()
  for algo in ('fedavg', 'nofl'):
    summary = json.loads((out / algo / 'summary.json').read_text())
    assert summary['algorithm'] == algo
    assert summary['config']['num_clients'] == 3
    assert 0.0 <= summary['final_round']['personal/accuracy_mean'] <= 1.0
    assert len(summary['model_architecture']) == 16   # the same MLP
    architectures.add(summary['model_architecture'])
    rounds = pd.read_csv(out / algo / 'rounds.csv')
    assert list(rounds['round']) == [1, 2]
    clients = pd.read_csv(out / algo / 'clients.csv')
    assert len(clients) == 2 * 3          # every client, every evaluation
  assert len(architectures) == 1
  assert (out / 'partition.json').exists()
  assert (out / 'comparison.md').exists()


def test_bad_input_fails_with_a_clear_message(tmp_path):
  proc = _run(['--algorithm=fedavgg', f'--output_dir={tmp_path}'])
  assert proc.returncode != 0
  assert "unknown algorithm 'fedavgg'" in proc.stdout
  proc = _run(['--dataset=iris', '--num_clients=3', '--clients_per_round=5',
               f'--output_dir={tmp_path}', '--progress=false'])
  assert proc.returncode != 0
  assert 'clients_per_round=5' in proc.stdout
  # Refused before any algorithm runs, not after FedAvg's rounds.
  proc = _run(['--algorithm=fedavg,afedcl', '--local_eval', '--dataset=iris',
               f'--output_dir={tmp_path / "eq10"}', '--progress=false'])
  assert proc.returncode != 0
  assert "--local_eval: afedcl does not report" in proc.stdout
  assert not (tmp_path / 'eq10').exists()


def test_every_algorithm_and_flag_is_checked_before_anything_runs(tmp_path):
  # A second algorithm's bad hyperparameter, a misspelled algorithm key,
  # flags that would be ignored: refused before FedAvg trains and before
  # anything is written.
  iris = ['--dataset=iris', '--num_clients=3', '--rounds=1',
          '--progress=false']
  for args, message in (
      (['--algorithm=fedavg,fedprox', '--algorithm_params={"fedprox": '
        '{"mu_": 1}}'], "fedprox does not take ['mu_']"),
      (['--algorithm=fedavg,fedprox', '--algorithm_params={"fedporx": '
        '{"mu": 1}}'], "--algorithm_params names ['fedporx'], which "
       '--algorithm (fedavg,fedprox) does not run'),
      (['--algorithm=fedavg,fedavg'], "--algorithm names ['fedavg'] more "
       'than once'),
      (['--algorithm='], '--algorithm names no algorithm'),
      (['--partition_file=p.json', '--alpha=0.1', '--partition=dirichlet'],
       '--partition_file fixes the partition and its splits; drop '
       '--partition, --alpha'),
      (['--partition=shards', '--min_samples=3'],
       "--min_samples applies to --partition=dirichlet only, not 'shards'"),
      (['--clients_per_round=0'], 'clients_per_round=0 must be between 1'),
      # Names the data set and model registries check: a message, not a
      # traceback.
      (['--dataset=irs'], "Unknown data set 'irs'; known: ["),
      (['--model=mlpp'], "Unknown encoder 'mlpp'; known encoders: "),
      (['--partition_file=missing.json'], 'missing.json'),
  ):
    out = tmp_path / 'never'
    proc = _run(iris + args + [f'--output_dir={out}'])
    assert proc.returncode != 0, args
    assert message in proc.stdout, (args, proc.stdout[-2000:])
    assert 'Traceback' not in proc.stdout, (args, proc.stdout[-2000:])
    assert 'personalized acc' not in proc.stdout
    assert not out.exists(), args


def test_a_refused_resume_writes_nothing(tmp_path):
  # Resuming with a changed partition is refused before partition.json
  # is rewritten: the finished run's record stays its own.
  common = ['--algorithm=fedavg', '--dataset=iris', '--num_clients=3',
            '--rounds=1', '--progress=false', f'--output_dir={tmp_path}']
  assert _run(common + ['--alpha=0.5']).returncode == 0
  written = (tmp_path / 'partition.json').read_bytes()
  proc = _run(common + ['--alpha=5'])
  assert proc.returncode != 0
  assert (f'{tmp_path} holds checkpoints of fedavg written with another '
          'configuration; use another --output_dir, or --noresume') in (
              proc.stdout), proc.stdout[-2000:]
  assert (tmp_path / 'partition.json').read_bytes() == written
  # --noresume starts afresh, with the new partition.
  assert _run(common + ['--alpha=5', '--noresume']).returncode == 0
  assert (tmp_path / 'partition.json').read_bytes() != written


def test_participation_rate_is_validated(tmp_path):
  proc = _run(['--dataset=iris', '--num_clients=3', '--participation_rate=1.5',
               f'--output_dir={tmp_path}', '--progress=false'])
  assert proc.returncode != 0
  assert '--participation_rate must be in (0, 1]' in proc.stdout


def test_capping_worker_concurrency_changes_memory_not_results(tmp_path):
  # --max_concurrent_clients is the knob for encoders whose uncapped round
  # does not fit in memory (BUILD_NOTES): the rounds it trains must be the
  # uncapped ones, bit for bit, stateful clients included.
  common = ['--algorithm=fedavg,moon', '--dataset=iris', '--partition=iid',
            '--num_clients=4', '--rounds=2', '--model=mlp', '--batch_size=8',
            '--learning_rate=0.1', '--progress=false']
  for name, extra in (('uncapped', []),
                      ('capped', ['--max_concurrent_clients=1'])):
    proc = _run(common + extra + [f'--output_dir={tmp_path / name}'])
    assert proc.returncode == 0, proc.stdout[-3000:]
    summary = json.loads(
        (tmp_path / name / 'moon' / 'summary.json').read_text())
    assert summary['config']['max_concurrent_clients'] == (
        1 if extra else None)
  for algo in ('fedavg', 'moon'):
    tables = [pd.read_csv(tmp_path / name / algo / 'rounds.csv')
              for name in ('uncapped', 'capped')]
    timing = [c for c in tables[0].columns if 'seconds' in c]
    assert list(tables[0]['round']) == [1, 2]
    pd.testing.assert_frame_equal(tables[0].drop(columns=timing),
                                  tables[1].drop(columns=timing),
                                  check_exact=True)
  proc = _run(common + ['--max_concurrent_clients=0',
                        f'--output_dir={tmp_path / "zero"}'])
  assert proc.returncode != 0
  assert ('--max_concurrent_clients=0: 0 is not a positive integer'
          in proc.stdout)


def test_comparison_table_reads_only_the_summary():
  from programs import run  # pylint: disable=import-outside-toplevel
  table = run.comparison_table({
      'fedavg': run.Summary(
          final={'personal/accuracy_mean': 0.5, 'global/accuracy_mean': 0.25},
          best_test={'personal/accuracy_mean': 0.75, 'round': 3},
          seconds_per_round=1.5),
      'regressor': run.Summary(
          final={'personal/mae_mean': 0.125, 'global/mae_mean': 0.5},
          best_test={'round': 1}, seconds_per_round=2.0)})
  rows = table.splitlines()
  assert rows[2] == '| fedavg | 50.00 | - | - | 25.00 | 75.00 (3) | 1.50 |'
  assert rows[3] == '| regressor | MAE 0.125 | - | - | 0.500 | - | 2.00 |'
