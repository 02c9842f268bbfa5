"""Running a program as a user does, for the end-to-end program tests."""

import csv
import os
import pathlib
import re
import shlex
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def run_program(module: str, args: list[str], timeout: int = 600):
  """`python -m module args`, stdout+stderr piped through `cat`.

  The pipe matters: an orphaned TFF worker holding stdout open would make
  the call hang until the timeout (field guide pitfall 10).
  """
  env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL='2')
  # Quoted: a method or encoder spec may hold ';' (`moon:mu=1;temperature=1`).
  cmd = shlex.join([sys.executable, '-m', module] + args) + ' 2>&1 | cat'
  return subprocess.run(['bash', '-o', 'pipefail', '-c', cmd], cwd=ROOT,
                        env=env, capture_output=True, text=True,
                        timeout=timeout)


def check_checkpoint_spacing(module: str, args: list[str],
                             cell: pathlib.Path) -> None:
  """A grid's --checkpoint_every spaces a cell's checkpoints, not its config.

  `args` run one cell, `cell`, with --eval_every=3 and without --rounds.
  """
  proc = run_program(module, args + ['--rounds=3', '--checkpoint_every=1'])
  assert proc.returncode == 0, proc.stdout[-3000:]
  # A checkpoint every round, of which the newest two are kept (with the
  # default spacing, --eval_every=3, round 3 would be the only one).
  assert sorted(os.listdir(cell / 'checkpoints')) == [
      'round_000002', 'round_000003']
  # Run on to round 4 with the default spacing: the cell resumes from the
  # checkpoint the other spacing wrote (round 3) and trains round 4 only.
  more = run_program(module, args + ['--rounds=4'])
  assert more.returncode == 0, more.stdout[-3000:]
  assert re.search(r'^\S+ round 4/4: ', more.stdout, re.MULTILINE)
  assert not re.search(r'^\S+ round [123]/4: ', more.stdout, re.MULTILINE)
  with open(cell / 'rounds.csv') as f:
    assert [int(row['round']) for row in csv.DictReader(f)] == [1, 2, 3, 4]
  assert sorted(os.listdir(cell / 'checkpoints')) == [
      'round_000003', 'round_000004']
  bad = run_program(module, args + ['--rounds=3', '--checkpoint_every=0',
                                    '--write_only'])
  assert bad.returncode != 0
  assert 'checkpoint_every' in bad.stdout, bad.stdout[-2000:]
