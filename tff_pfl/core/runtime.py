"""The TFF execution context, and making sure its worker process ends.

TFF 0.87's default context runs computations in a separate `worker_binary`
process. If the Python interpreter exits without tearing the context down,
that process can outlive Python while holding the parent's stdout/stderr,
so `python -m programs.run ... | cat` (and any CI log capture) hangs. The fix
verified in `shared/notes/tff-0.87-field-guide.md` (pitfall 10) is to drop
the default context and collect garbage at exit, which stops the worker.

The clean-up is registered when this module is imported, not only once a
context is installed: TFF's import alone creates a `ServiceManager` whose
`__del__` runs at interpreter teardown, after `subprocess` is gone, and
prints `AttributeError: 'NoneType' object has no attribute 'Popen'` below
the real error whenever a program fails early (e.g. on a bad flag).
Collecting it in `atexit`, while the modules are still alive, ends the
program on its own error message.

Values left on the worker. Every call ships its argument (server state,
client states, datasets) to the worker and gets a result back, and TFF's
`RemoteExecutor` frees such worker values only in batches of 20 released
references (`dispose_batch_size=20`, not settable through
`set_sync_local_cpp_execution_context`). A round is about three references
(the computation, its argument, its result), so the worker kept the last
~7 rounds' arguments and results alive: with AFedCL on ResNet-50 and
`keep_global_encoder` that is ~3.5 GB per round, and the worker grew from
5.7 to 17 GB in three rounds and was OOM-killed every three rounds on a
23 GB machine (BUILD_NOTES.md, forty-fourth session). `ensure_context`
therefore makes the executor TFF's local factory builds free each value as
soon as Python drops its last reference to it (`dispose_batch_size=1`); it
changes no result, only when the worker frees memory.

The worker's malloc arenas. With the values freed, a ResNet-50 AFedCL
worker still stepped from ~10.5 to ~14.4 GB around round 20 and was killed
once in 40 rounds; glibc gives the worker's threads their own malloc arenas
(up to 8 per core) and returns little of them to the system. Started with
`MALLOC_ARENA_MAX=2`, the same cell at another seed stayed at or under
10.6 GiB over all 40 rounds with no kill, at the same speed (BUILD_NOTES.md,
forty-fifth session). `ensure_context` therefore puts `MALLOC_ARENA_MAX=2`
in the environment the worker inherits, unless the user has set it. glibc
reads it when a process starts: this Python process is not affected, every
process it starts after `ensure_context` is.

Installing the context also logs a warning when protobuf runs as pure Python:
TFF builds and calls computations through protobuf messages, and the
pure-Python backend (protobuf 3.20 on Python 3.11, which has no compiled
wheel for it) makes a small simulation about 2.5 times slower
(BUILD_NOTES.md, "protobuf").
"""

import atexit
import functools
import gc
import os
import signal
import time
import types
from typing import Optional

from absl import logging
import google.protobuf
from google.protobuf.internal import api_implementation
import psutil
import tensorflow_federated as tff
from tensorflow_federated.python.core.impl.executor_stacks import executor_factory
from tensorflow_federated.python.core.impl.executors import remote_executor

_installed = False


def _workers() -> list['psutil.Process']:
  """This process's TFF `worker_binary` children.

  Ended workers that TFF has not reaped yet (zombies) are included.
  """
  try:
    children = psutil.Process().children()
  except psutil.Error:
    return []
  workers = []
  for child in children:
    try:
      if child.name().startswith('worker_binary'):
        workers.append(child)
    except psutil.Error:
      continue
  return workers


def _stop_workers(timeout_s: float) -> None:
  """Stops this process's TFF workers: SIGTERM, then SIGKILL after a wait.

  TFF's own clean-up (`ServiceManager.__del__`) sends SIGINT and then waits
  for the worker without a time limit. A program started in the background
  (`cmd &` or `nohup cmd &` from a script) runs with SIGINT ignored, which
  the worker inherits, so SIGINT never ends it: the Python process hung at
  exit (seen after a 30-minute MNIST run), and with a time limit every stop
  waited it out (10 s per stop). SIGTERM is not ignored there.
  The ended workers are left as zombies for TFF's `Popen.wait()` to reap.
  """
  workers = _workers()
  for w in workers:
    try:
      w.send_signal(signal.SIGTERM)
    except psutil.Error:
      pass
  deadline = time.monotonic() + timeout_s
  while workers and time.monotonic() < deadline:
    workers = [w for w in workers if _running(w)]
    time.sleep(0.05)
  for w in workers:
    try:
      w.kill()
    except psutil.Error:
      pass


def _running(process: 'psutil.Process') -> bool:
  try:
    return process.status() != psutil.STATUS_ZOMBIE
  except psutil.Error:
    return False


def shutdown(timeout_s: float = 10.0) -> None:
  """Ends the TFF worker process and drops the default TFF context."""
  global _installed
  _stop_workers(timeout_s)
  tff.test.set_no_default_context()
  gc.collect()
  _installed = False


def protobuf_backend() -> str:
  """The protobuf implementation in use: 'upb', 'cpp' or 'python'."""
  return api_implementation.Type()


def _warn_if_pure_python_protobuf() -> None:
  if protobuf_backend() == 'python':
    logging.warning(
        'protobuf %s runs as pure Python, which makes building and calling '
        'TFF computations ~2.5x slower; install protobuf>=4.21.6 '
        '(requirements/lock.txt pins 4.25.3).', google.protobuf.__version__)


def _dispose_worker_values_promptly() -> None:
  """Makes TFF's local factory build `RemoteExecutor(dispose_batch_size=1)`.

  The factory's stack function looks `remote_executor.RemoteExecutor` up in
  its own module when it builds an executor; only that name is replaced
  there, so TFF's `RemoteExecutor` class is untouched elsewhere.
  """
  executor_factory.remote_executor = types.SimpleNamespace(
      RemoteExecutor=functools.partial(remote_executor.RemoteExecutor,
                                       dispose_batch_size=1))


#: glibc malloc arenas the worker may use (module docstring).
WORKER_MALLOC_ARENA_MAX = '2'


def _limit_worker_malloc_arenas() -> None:
  """Sets `MALLOC_ARENA_MAX` for the worker, unless it is set already.

  TFF starts the worker with `subprocess.Popen` at the first call, and it
  inherits this process's environment then (and again when TFF restarts a
  worker that died).
  """
  os.environ.setdefault('MALLOC_ARENA_MAX', WORKER_MALLOC_ARENA_MAX)


def ensure_context(
    max_concurrent_computation_calls: Optional[int] = None,
) -> None:
  """Installs a sync local C++ context unless one is installed.

  It stays until `shutdown()` (which also runs at exit); a cap passed while
  a context is installed is ignored, so `shutdown()` first to change it.
  Its worker frees each call's values as soon as Python releases them and
  runs with at most two malloc arenas unless `MALLOC_ARENA_MAX` is set
  (module docstring).

  Args:
    max_concurrent_computation_calls: caps how many client computations the
      worker runs at once (memory scales with it); `None` or -1 = no cap.
  """
  global _installed
  if _installed:
    return
  cap = -1 if max_concurrent_computation_calls is None else int(
      max_concurrent_computation_calls)
  _warn_if_pure_python_protobuf()
  _dispose_worker_values_promptly()
  _limit_worker_malloc_arenas()
  tff.backends.native.set_sync_local_cpp_execution_context(
      max_concurrent_computation_calls=cap)
  _installed = True


atexit.register(shutdown)
