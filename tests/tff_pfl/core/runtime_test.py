"""Tests for tff_pfl.core.runtime: no TFF worker outlives its parent."""

import shutil
import signal
import subprocess

from tff_pfl.core import runtime


def test_a_worker_that_ignores_sigint_is_killed(tmp_path):
  # A stand-in for TFF's worker_binary that ignores SIGINT, as the real one
  # sometimes does after long runs (then TFF's own clean-up waits forever).
  fake = tmp_path / 'worker_binary_t'       # process name <= 15 characters
  shutil.copy('/bin/bash', fake)
  proc = subprocess.Popen(
      [str(fake), '-c', 'trap "" INT; while :; do sleep 0.1; done'])
  try:
    runtime._stop_workers(timeout_s=0.5)  # pylint: disable=protected-access
    assert proc.wait(timeout=10) == -signal.SIGKILL
  finally:
    if proc.poll() is None:
      proc.kill()
