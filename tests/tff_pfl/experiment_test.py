"""Tests for tff_pfl.experiment's run fingerprint (no training)."""

import dataclasses

from tff_pfl import experiment


def test_fingerprint_ignores_run_time_knobs_and_rounds_unless_scheduled():
  config = experiment.ExperimentConfig(rounds=10)
  more = dataclasses.replace(config, rounds=20, eval_every=5,
                             local_eval=True, data_dir='/elsewhere',
                             max_concurrent_clients=1)
  # FedAvg may resume to more rounds: nothing it computes depends on them.
  assert (experiment.fingerprint(config, 'fedavg')
          == experiment.fingerprint(more, 'fedavg'))
  # FedPSD's alpha = t / total_rounds: a longer run is another run.
  assert (experiment.fingerprint(config, 'fedpsd')
          != experiment.fingerprint(more, 'fedpsd'))
  assert (experiment.fingerprint(config, 'fedpsd')
          == experiment.fingerprint(dataclasses.replace(config, eval_every=3),
                                    'fedpsd'))
  other = dataclasses.replace(config, seed=1)
  assert (experiment.fingerprint(config, 'fedavg')
          != experiment.fingerprint(other, 'fedavg'))
