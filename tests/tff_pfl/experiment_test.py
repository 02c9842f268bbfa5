"""Tests for tff_pfl.experiment: the run fingerprint, reproducibility."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from tff_pfl import experiment
from tff_pfl.data import dataset as dataset_lib
from tff_pfl.data import partition as partition_lib


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


def test_a_partition_file_is_reused_and_checked_against_the_data(tmp_path):
  config = experiment.ExperimentConfig(
      dataset='iris', num_clients=3, clients_per_round=3,
      partition_params={'alpha': 0.3}, seed=4)
  made = experiment.prepare(config).partition
  path = tmp_path / 'partition.json'
  made.save(path)
  # Another seed, but the file fixes the clients' samples.
  again = experiment.prepare(dataclasses.replace(
      config, partition_file=str(path), seed=9)).partition
  for s in partition_lib.SPLITS:
    for a, b in zip(made.indices(s), again.indices(s)):
      np.testing.assert_array_equal(a, b)
  seed9 = experiment.prepare(dataclasses.replace(config, seed=9)).partition
  assert any(not np.array_equal(a, b) for a, b in zip(
      made.indices('train'), seed9.indices('train')))
  # A validation split in the file is used (the file decides the splits).
  with_val = dataclasses.replace(config, val_fraction=0.2,
                                 train_fraction=0.55)
  made_val = experiment.prepare(with_val)
  assert made_val.has_val and not experiment.prepare(config).has_val
  made_val.partition.save(tmp_path / 'val.json')
  reloaded = experiment.prepare(dataclasses.replace(
      config, partition_file=str(tmp_path / 'val.json')))
  assert reloaded.has_val
  val = reloaded.dataset_fn(reloaded.client_ids[0], 0, 'val')
  assert sum(int(tf.shape(b['y'])[0]) for b in val) == len(
      reloaded.partition.indices('val')[0]) > 0
  # Same size, other labels (another data set or sample order): refused.
  shuffled = np.random.default_rng(0).permutation(made.labels)
  partition_lib.make_partition(
      shuffled, num_clients=3, method='iid', seed=0, num_classes=3
  ).save(tmp_path / 'other.json')
  with pytest.raises(ValueError, match=(
      r'other\.json was made for other labels than iris has: \d+ of 150 '
      'samples differ')):
    experiment.prepare(dataclasses.replace(
        config, partition_file=str(tmp_path / 'other.json')))
  with pytest.raises(ValueError, match='partition.json has 3 clients, '
                     'config asks for 4'):
    experiment.prepare(dataclasses.replace(
        config, partition_file=str(path), num_clients=4,
        clients_per_round=4))


def test_a_regression_partition_file_is_checked_against_the_targets(
    tmp_path, monkeypatch):
  rng = np.random.default_rng(0)
  x = rng.normal(size=(60, 4)).astype(np.float32)
  y = rng.normal(size=60).astype(np.float32)

  def load(name, data_dir, **options):
    del data_dir, options
    return dataset_lib.ArrayDataset(
        name=name, x_train=x, y_train=targets, x_test=None, y_test=None,
        num_classes=0, class_names=(), task='regression')

  monkeypatch.setattr(experiment.data_registry, 'load_dataset', load)
  targets = y
  config = experiment.ExperimentConfig(
      dataset='synthetic', num_clients=3, clients_per_round=3, model='mlp')
  path = tmp_path / 'partition.json'
  experiment.prepare(config).partition.save(path)
  with_file = dataclasses.replace(config, partition_file=str(path))
  experiment.prepare(with_file)          # the same targets: accepted
  # Made with 10 bins, or with one label for all (IID): checked by as
  # many bins as the file records.
  for bins in (10, 1):
    partition_lib.make_partition(
        partition_lib.bin_targets(y, num_bins=bins), num_clients=3,
        method='iid', seed=0).save(tmp_path / f'bins{bins}.json')
    experiment.prepare(dataclasses.replace(
        config, partition_file=str(tmp_path / f'bins{bins}.json')))
  targets = y[::-1].copy()               # same size, another sample order
  with pytest.raises(ValueError, match=(
      r'was made for other targets \(compared by their 5 quantile bins, as '
      r'the file records\) than synthetic has: \d+ of 60 samples differ')):
    experiment.prepare(with_file)
