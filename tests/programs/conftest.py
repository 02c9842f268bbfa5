"""Running a program as a user does, for the end-to-end program tests."""

import os
import pathlib
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
