"""Tests for tff_pfl.core.runtime: no TFF worker outlives its parent."""

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tff_pfl.core import runtime


def _stand_in_worker(tmp_path, ignored: str):
  """A stand-in for TFF's worker_binary that ignores the signals `ignored`."""
  fake = tmp_path / 'worker_binary_t'       # process name <= 15 characters
  shutil.copy('/bin/bash', fake)
  ready = tmp_path / 'trap_installed'
  proc = subprocess.Popen([
      str(fake), '-c',
      f'trap "" {ignored}; touch {ready}; while :; do sleep 0.1; done'])
  # A signal sent before bash has installed the trap would end it at once:
  # wait for the trap, so the test checks the path it names.
  deadline = time.monotonic() + 10
  while not ready.exists():
    assert time.monotonic() < deadline, 'stand-in worker never started'
    assert proc.poll() is None, 'stand-in worker exited early'
    time.sleep(0.01)
  return proc


@pytest.mark.parametrize('ignored, timeout_s, ended_by', [
    # A program started in the background by a script runs with SIGINT
    # ignored, and so does its worker: TFF's own SIGINT never ends it.
    ('INT', 30.0, signal.SIGTERM),
    ('INT TERM', 0.5, signal.SIGKILL),
])
def test_a_worker_is_ended_whatever_it_ignores(tmp_path, ignored, timeout_s,
                                               ended_by):
  proc = _stand_in_worker(tmp_path, ignored)
  try:
    runtime._stop_workers(timeout_s=timeout_s)  # pylint: disable=protected-access
    assert proc.wait(timeout=10) == -ended_by
  finally:
    if proc.poll() is None:
      proc.kill()


def test_a_failing_program_ends_on_its_own_error():
  # TFF's import creates a ServiceManager whose __del__ fails at interpreter
  # teardown ("'NoneType' object has no attribute 'Popen'") unless it is
  # collected at exit while the modules are alive: importing runtime
  # registers that clean-up.
  code = ('import tensorflow_federated\n'
          'from tff_pfl.core import runtime\n'
          'raise ValueError("bad input, named")\n')
  result = subprocess.run([sys.executable, '-c', code], capture_output=True,
                          text=True, timeout=300, check=False)
  assert result.returncode == 1
  assert 'ValueError: bad input, named' in result.stderr
  assert 'Exception ignored' not in result.stderr, result.stderr[-2000:]
  tail = [l for l in result.stderr.splitlines() if l.strip()][-1]
  assert tail == 'ValueError: bad input, named', tail


def test_the_locked_stack_runs_compiled_protobuf():
  # protobuf 3.20 has no compiled wheel for Python 3.11: it ran as pure
  # Python and made every TFF build and call ~2.5x slower (BUILD_NOTES.md).
  assert runtime.protobuf_backend() in ('upb', 'cpp')


def test_pure_python_protobuf_is_warned_about(monkeypatch):
  warnings = []
  monkeypatch.setattr(runtime.logging, 'warning',
                      lambda msg, *args: warnings.append(msg % args))
  runtime._warn_if_pure_python_protobuf()  # pylint: disable=protected-access
  assert not warnings
  monkeypatch.setattr(runtime, 'protobuf_backend', lambda: 'python')
  runtime._warn_if_pure_python_protobuf()  # pylint: disable=protected-access
  assert len(warnings) == 1 and 'runs as pure Python' in warnings[0]
  # Installing the context is where users meet it.
  installed = []
  monkeypatch.setattr(runtime, '_installed', False)
  # ensure_context sets it for the worker; restored after the test.
  monkeypatch.delenv('MALLOC_ARENA_MAX', raising=False)
  monkeypatch.setattr(
      runtime.tff.backends.native, 'set_sync_local_cpp_execution_context',
      lambda **kwargs: installed.append(kwargs))
  runtime.ensure_context()
  assert installed == [{'max_concurrent_computation_calls': -1}]
  assert len(warnings) == 2
  assert os.environ['MALLOC_ARENA_MAX'] == runtime.WORKER_MALLOC_ARENA_MAX
  runtime.ensure_context()   # already installed: neither again
  assert len(installed) == 1 and len(warnings) == 2


def test_the_worker_frees_each_call_s_values():
  # TFF frees worker values in batches of 20 released references, about
  # seven calls' arguments and results: 12 calls on a 64 MB tensor grew
  # TFF's default worker by ~2.1 GB, and ResNet-50 AFedCL rounds by ~3.5 GB
  # each until the kernel killed the worker. With `ensure_context` the
  # growth stays within a few such values (124 MB measured).
  code = '''
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from tff_pfl.core import runtime
runtime.ensure_context()
n = 16 * 1024 * 1024  # 64 MB of float32
@tff.tensorflow.computation(tf.TensorSpec([n], tf.float32))
def add_one(x):
  return x + 1.0
x = add_one(np.zeros([n], np.float32))
worker, = runtime._workers()
base = peak = worker.memory_info().rss
for _ in range(11):
  x = add_one(x)
  peak = max(peak, worker.memory_info().rss)
print('growth_mb', (peak - base) >> 20, 'value', float(x[0]), float(x[-1]))
'''
  result = subprocess.run([sys.executable, '-c', code], capture_output=True,
                          text=True, timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-2000:]
  words = result.stdout.split()
  assert words[words.index('value') + 1:] == ['12.0', '12.0']
  growth_mb = int(words[words.index('growth_mb') + 1])
  assert growth_mb < 4 * 64, growth_mb


@pytest.mark.parametrize('preset, expected', [(None, '2'), ('4', '4')])
def test_the_worker_runs_with_few_malloc_arenas_unless_told(preset, expected):
  # With its values freed, a ResNet-50 AFedCL worker still stepped from
  # ~10.5 to ~14.4 GB mid-run under glibc's default arenas (up to 8 per
  # core) and stayed at or under 10.6 GiB over 40 rounds with two. A value
  # the user set is kept.
  code = '''
import os
import tensorflow as tf
import tensorflow_federated as tff
from tff_pfl.core import runtime
runtime.ensure_context()
@tff.tensorflow.computation(tf.int32)
def add_one(x):
  return x + 1
assert add_one(1) == 2
worker, = runtime._workers()
print('worker', worker.environ().get('MALLOC_ARENA_MAX'))
print('python', os.environ.get('MALLOC_ARENA_MAX'))
'''
  env = {k: v for k, v in os.environ.items() if k != 'MALLOC_ARENA_MAX'}
  if preset is not None:
    env['MALLOC_ARENA_MAX'] = preset
  result = subprocess.run([sys.executable, '-c', code], capture_output=True,
                          text=True, timeout=300, check=False, env=env)
  assert result.returncode == 0, result.stderr[-2000:]
  lines = result.stdout.splitlines()
  assert f'worker {expected}' in lines, result.stdout
  assert f'python {expected}' in lines, result.stdout
