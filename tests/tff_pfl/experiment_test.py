"""Tests for tff_pfl.experiment: the run fingerprint, reproducibility."""

import dataclasses

import numpy as np

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


def test_fingerprint_reads_only_the_algorithms_own_parameters():
  # programs.run gives several algorithms one config: changing Ditto's
  # lambda must not block resuming FedAvg, only Ditto.
  both = experiment.ExperimentConfig(
      algorithm_params={'fedavg': {}, 'ditto': {'lambda_': 0.1}})
  changed = dataclasses.replace(
      both, algorithm_params={'fedavg': {}, 'ditto': {'lambda_': 1.0}})
  assert (experiment.fingerprint(both, 'fedavg')
          == experiment.fingerprint(changed, 'fedavg'))
  assert (experiment.fingerprint(both, 'ditto')
          != experiment.fingerprint(changed, 'ditto'))
  # A config with the algorithm's entry alone (a grid cell) hashes as
  # before this rule: its in-progress checkpoints still resume.
  only = dataclasses.replace(both, algorithm_params={'ditto': {'lambda_': 0.1}})
  assert (experiment.fingerprint(both, 'ditto')
          == experiment.fingerprint(only, 'ditto'))


def test_a_run_with_dropout_is_reproduced_exactly():
  # Keras' Dropout is not seeded inside a TFF computation (each
  # instantiation draws a new op seed); the MLP's SeededDropout is, so a
  # second run with the same seed trains the same model.
  config = experiment.ExperimentConfig(
      dataset='iris', num_clients=3, clients_per_round=3, rounds=2,
      model='mlp', model_options={'dropout': 0.5}, learning_rate=0.1)
  data = experiment.prepare(config)
  # In the session's TFF context (tests/tff_pfl/conftest.py), left installed
  # for the tests after this one.
  first = experiment.run_algorithm(config, data, 'fedavg')
  again = experiment.run_algorithm(config, data, 'fedavg')
  assert first.final == again.final
  for a, b in zip(first.server_state.global_model_weights.trainable,
                  again.server_state.global_model_weights.trainable):
    np.testing.assert_array_equal(a, b)
