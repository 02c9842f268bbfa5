"""The TFF execution context, and making sure its worker process ends.

TFF 0.87's default context runs computations in a separate `worker_binary`
process. If the Python interpreter exits without tearing the context down,
that process can outlive Python while holding the parent's stdout/stderr,
so `python -m programs.run ... | cat` (and any CI log capture) hangs. The fix
verified in `shared/notes/tff-0.87-field-guide.md` (pitfall 10) is to drop
the default context and collect garbage at exit, which stops the worker.
"""

import atexit
import gc
from typing import Optional

import tensorflow_federated as tff

_installed = False
_atexit_registered = False


def shutdown() -> None:
  """Drops the default TFF context, which terminates its worker process."""
  global _installed
  tff.test.set_no_default_context()
  gc.collect()
  _installed = False


def ensure_context(
    max_concurrent_computation_calls: Optional[int] = None,
) -> None:
  """Installs a sync local C++ context once, with shutdown registered at exit.

  Args:
    max_concurrent_computation_calls: caps how many client computations the
      worker runs at once (memory scales with it); `None` or -1 = no cap.
  """
  global _installed, _atexit_registered
  if not _atexit_registered:
    atexit.register(shutdown)
    _atexit_registered = True
  if _installed:
    return
  cap = -1 if max_concurrent_computation_calls is None else int(
      max_concurrent_computation_calls)
  tff.backends.native.set_sync_local_cpp_execution_context(
      max_concurrent_computation_calls=cap)
  _installed = True
