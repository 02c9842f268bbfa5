"""Checkpoint/resume: a stopped and resumed run equals an unstopped one."""

import numpy as np
import pytest
import tensorflow_federated as tff

from tff_pfl.algorithms import ditto
from tff_pfl.core import checkpoint
from tff_pfl.core import client_state
from tff_pfl.core import loop
from tff_pfl.core import sampling

from tests.tff_pfl import conftest as helpers

IDS = [f'client_{i:03d}' for i in range(4)]
ARRAYS = dict(zip(IDS, helpers.make_client_arrays(4)))


def _dataset_fn(client_id, round_num, split):
  x, y = ARRAYS[client_id]
  ds = helpers.to_dataset(x, y, batch_size=6)
  if split == 'train':   # round-dependent order, as the real pipeline has
    ds = ds.unbatch().shuffle(64, seed=loop.derive_seed(round_num, client_id))
    ds = ds.batch(6)
  return ds


def _run(rounds, ckpt_dir, store_dir=None, fingerprint='a', architecture=''):
  spec = helpers.make_spec()
  process = ditto.build_ditto(
      spec, initial_weights=spec.initial_weights(0), lambda_=0.5,
      client_optimizer=tff.learning.optimizers.build_sgdm(0.1))
  if store_dir:
    store = client_state.DiskStore(process.initial_client_state, store_dir)
  else:
    store = client_state.MemoryStore(process.initial_client_state)
  return loop.run(
      process, client_ids=IDS, dataset_fn=_dataset_fn, rounds=rounds,
      sampler=sampling.ParticipationStream(IDS, clients_per_round=2, seed=5),
      store=store, eval_every=2,
      checkpoints=checkpoint.CheckpointManager(ckpt_dir) if ckpt_dir else None,
      fingerprint=fingerprint, architecture=architecture), store


def test_resumed_run_equals_unstopped_run(tmp_path):
  full, full_store = _run(5, None)
  # Stop after round 4 (an evaluation round of both runs, so the stopped
  # run's final evaluation is one the unstopped run also makes).
  part, _ = _run(4, str(tmp_path / 'ck'), str(tmp_path / 'states'))
  assert part.final['round'] == 4
  assert checkpoint.CheckpointManager(str(tmp_path / 'ck')).rounds() == [3, 4]
  # A fresh store folder: the client states must come from the checkpoint,
  # not from the files the stopped run left behind.
  resumed, store = _run(5, str(tmp_path / 'ck'), str(tmp_path / 'fresh'))
  assert [r['round'] for r in resumed.rounds] == [1, 2, 3, 4, 5]
  assert resumed.final == pytest.approx(full.final, rel=1e-6)
  assert resumed.best_test['round'] == full.best_test['round']
  for a, b in zip(resumed.server_state.global_model_weights.trainable,
                  full.server_state.global_model_weights.trainable):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
  for cid in IDS:
    np.testing.assert_allclose(
        store.get(cid).personal_weights.trainable[0],
        full_store.get(cid).personal_weights.trainable[0], rtol=1e-6,
        atol=1e-7)
  assert len(resumed.clients) == len(full.clients)


def test_resume_with_another_configuration_is_refused(tmp_path):
  _run(2, str(tmp_path / 'ck'))
  with pytest.raises(ValueError, match='different configuration'):
    _run(3, str(tmp_path / 'ck'), fingerprint='b')


def test_resume_with_another_model_architecture_is_refused(tmp_path):
  _run(2, str(tmp_path / 'ck'), architecture='momentum_0.999')
  with pytest.raises(ValueError, match='model built differently'):
    _run(3, str(tmp_path / 'ck'), architecture='momentum_0.9')


def test_checkpoint_without_architecture_resumes_with_a_warning(
    tmp_path, caplog):
  _run(2, str(tmp_path / 'ck'))   # as checkpoints written before the check
  result, _ = _run(3, str(tmp_path / 'ck'), architecture='now_recorded')
  assert [r['round'] for r in result.rounds] == [1, 2, 3]
  assert 'records no model architecture' in caplog.text
