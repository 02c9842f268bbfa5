"""Test-session configuration shared by every test folder."""

import os

# Quieter TensorFlow C++ logs (also inherited by the TFF worker process).
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')


def pytest_sessionfinish(session, exitstatus):
  """Ends the TFF worker, so no orphan keeps the CI log pipe open."""
  del session, exitstatus
  import sys  # pylint: disable=g-import-not-at-top
  if 'tensorflow_federated' in sys.modules:
    from tff_pfl.core import runtime  # pylint: disable=g-import-not-at-top
    runtime.shutdown()
