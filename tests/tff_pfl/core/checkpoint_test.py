"""Checkpoint/resume: a stopped and resumed run equals an unstopped one."""

import collections
import tracemalloc

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_pfl.algorithms import ditto
from tff_pfl.algorithms import fedpsd
from tff_pfl.core import checkpoint
from tff_pfl.core import client_state
from tff_pfl.core import loop
from tff_pfl.core import model_spec
from tff_pfl.core import sampling
from tff_pfl.data import client_data

from tests.tff_pfl import conftest as helpers

IDS = [f'client_{i:03d}' for i in range(4)]
ARRAYS = dict(zip(IDS, helpers.make_client_arrays(4)))


def _dataset_fn(client_id, round_num, split, index=False):
  x, y = ARRAYS[client_id]
  ds = tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=x, y=y))
  if index:
    ds = client_data.with_index(ds)
  if split == 'train':   # round-dependent order, as the real pipeline has
    ds = ds.shuffle(64, seed=loop.derive_seed(round_num, client_id))
  return ds.batch(6)


def _ditto():
  spec = helpers.make_spec()
  return ditto.build_ditto(
      spec, initial_weights=spec.initial_weights(0), lambda_=0.5,
      client_optimizer=tff.learning.optimizers.build_sgdm(0.1))


def _fedpsd():
  """FedPSD: its client state grows (stored predictions, one row per
  training sample), which a restored checkpoint must accept."""
  base = helpers.make_spec()
  spec = model_spec.ModelSpec(
      base.keras_model_fn,
      dict(base.input_spec, index=tf.TensorSpec([None], tf.int64)),
      'classification', helpers.NUM_CLASSES)
  return fedpsd.build_fedpsd(
      spec, initial_weights=spec.initial_weights(0),
      client_optimizer=tff.learning.optimizers.build_sgdm(0.1),
      local_epochs=2, total_rounds=5)


def _run(rounds, ckpt_dir, store_dir=None, fingerprint='a', architecture='',
         build=_ditto, checkpoint_every=1, progress=None):
  process = build()
  dataset_fn = _dataset_fn
  if build is _fedpsd:
    dataset_fn = lambda c, r, split: _dataset_fn(c, r, split, index=True)
  if store_dir:
    store = client_state.DiskStore(process.initial_client_state, store_dir)
  else:
    store = client_state.MemoryStore(process.initial_client_state)
  return loop.run(
      process, client_ids=IDS, dataset_fn=dataset_fn, rounds=rounds,
      sampler=sampling.ParticipationStream(IDS, clients_per_round=2, seed=5),
      store=store, eval_every=2, progress=progress,
      checkpoints=checkpoint.CheckpointManager(ckpt_dir) if ckpt_dir else None,
      checkpoint_every=checkpoint_every, fingerprint=fingerprint,
      architecture=architecture), store


class _Killed(Exception):
  """Stands for the process being killed after a round."""


def _kill_after(round_num):
  def progress(r, row):
    del row
    if r == round_num:
      raise _Killed()
  return progress


def _recorder(ran):
  return lambda r, row: ran.append(r)


def test_resumed_run_equals_unstopped_run(tmp_path):
  full, full_store = _run(5, None)
  # Stop after round 4 (an evaluation round of both runs, so the stopped
  # run's final evaluation is one the unstopped run also makes).
  part, _ = _run(4, str(tmp_path / 'ck'), str(tmp_path / 'states'))
  assert part.final['round'] == 4
  assert checkpoint.CheckpointManager(str(tmp_path / 'ck')).rounds() == [3, 4]
  # A fresh store folder: the client states must come from the checkpoint,
  # not from the files the stopped run left behind.
  ran = []
  resumed, store = _run(5, str(tmp_path / 'ck'), str(tmp_path / 'fresh'),
                        progress=_recorder(ran))
  assert ran == [5]                      # rounds 1-4 came from the checkpoint
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


def test_a_run_killed_between_checkpoints_resumes_to_the_same_end(tmp_path):
  """Killed after round 5 with its newest checkpoint at round 3: the disk
  store already holds the states of rounds 4-5, which the resumed run must
  drop for the checkpoint's, then train rounds 4-6 again."""
  full, full_store = _run(6, None)
  ck, states = str(tmp_path / 'ck'), str(tmp_path / 'states')
  with pytest.raises(_Killed):
    _run(6, ck, states, checkpoint_every=3, progress=_kill_after(5))
  assert checkpoint.CheckpointManager(ck).rounds() == [3]
  # What a kill during a save leaves behind goes when the run reopens.
  (tmp_path / 'ck' / '.tmp_stale').mkdir()
  (tmp_path / 'ck' / '.tmp_stale' / 'clients.npz').write_bytes(b'partial')
  ran = []
  resumed, store = _run(6, ck, states, checkpoint_every=3,
                        progress=_recorder(ran))
  assert ran == [4, 5, 6]
  assert not (tmp_path / 'ck' / '.tmp_stale').exists()
  # Rounds 1 and 4 each began a process (tracing): not in the mean.
  secs = [r['round_seconds'] for r in resumed.rounds]
  assert resumed.seconds_per_round == pytest.approx(
      np.mean(secs[1:3] + secs[4:]))
  assert [r['round'] for r in resumed.rounds] == [1, 2, 3, 4, 5, 6]
  assert resumed.final == pytest.approx(full.final, rel=1e-6)
  assert resumed.best_test['round'] == full.best_test['round']
  for cid in IDS:
    got, want = store.get(cid), full_store.get(cid)
    for a, b in zip(got.personal_weights.trainable,
                    want.personal_weights.trainable):
      np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_a_fedpsd_run_resumes_with_its_grown_client_states(tmp_path):
  full, full_store = _run(5, None, build=_fedpsd)
  _run(4, str(tmp_path / 'ck'), build=_fedpsd)
  ran = []
  resumed, store = _run(5, str(tmp_path / 'ck'), build=_fedpsd,
                        progress=_recorder(ran))
  assert ran == [5]
  assert [r['round'] for r in resumed.rounds] == [1, 2, 3, 4, 5]
  assert resumed.final == pytest.approx(full.final, rel=1e-6)
  grown = 0
  for cid in IDS:
    got, want = store.get(cid), full_store.get(cid)
    assert int(got.num_participations) == int(want.num_participations)
    np.testing.assert_allclose(got.predictions, want.predictions,
                               rtol=1e-6, atol=1e-7)
    grown += np.shape(got.predictions)[0] > 0
  assert grown > 0


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


def test_client_states_stream_through_a_checkpoint_one_at_a_time(tmp_path):
  # 16 clients of 1 MB each in a DiskStore: saving and restoring hold about
  # one client's state, not all 16 MB (numpy reports to tracemalloc).
  def initial(cid):
    del cid
    return [np.zeros((512, 512), np.float32), np.int32(0)]

  store = client_state.DiskStore(initial, str(tmp_path / 'states'))
  rng = np.random.default_rng(0)
  states = {f'c{i:02d}': [rng.normal(size=(512, 512)).astype(np.float32),
                          np.int32(i)] for i in range(16)}
  for cid, state in states.items():
    store.put(cid, state)
  del state
  manager = checkpoint.CheckpointManager(str(tmp_path / 'ckpt'))
  server = [np.ones(3, np.float32)]
  tracemalloc.start()
  try:
    manager.save(1, server, store, {'rows': []})
    _, saved_peak = tracemalloc.get_traced_memory()
    restored_into = client_state.DiskStore(initial, str(tmp_path / 'back'))
    tracemalloc.reset_peak()
    restored = manager.restore_latest(server, restored_into)
    _, restored_peak = tracemalloc.get_traced_memory()
  finally:
    tracemalloc.stop()
  assert saved_peak < 4 * 2**20 and restored_peak < 4 * 2**20, (
      saved_peak, restored_peak)
  assert restored.round_num == 1
  assert sorted(restored_into.client_ids()) == sorted(states)
  for cid, (weights, visits) in states.items():
    got = restored_into.get(cid)
    np.testing.assert_array_equal(got[0], weights)
    assert int(got[1]) == visits
  # The file is np.savez's layout (np.load reads it; the test below
  # restores one that np.savez wrote).
  with np.load(tmp_path / 'ckpt' / 'round_000001' / 'clients.npz') as f:
    assert sorted(f.files) == sorted(f'{c}/{i}' for c in states
                                     for i in (0, 1))


def test_a_checkpoint_written_by_np_savez_restores_in_leaf_order(tmp_path):
  # Checkpoints before streaming wrote clients.npz with np.savez; twelve
  # leaves, so that a lexical order ('10' < '2') would show.
  def initial(cid):
    del cid
    return [np.zeros(i + 1, np.float32) for i in range(12)]

  states = {c: [np.full(i + 1, 10 * k + i, np.float32) for i in range(12)]
            for k, c in enumerate(['a', 'b'])}
  path = tmp_path / 'ckpt' / 'round_000003'
  path.mkdir(parents=True)
  np.savez(path / 'server.npz', leaf_0=np.ones(3, np.float32))
  np.savez(path / 'clients.npz', **{f'{c}/{i}': v for c, leaves in
                                     states.items()
                                     for i, v in enumerate(leaves)})
  (path / 'loop.json').write_text('{"rows": [], "round_num": 3}')
  store = client_state.MemoryStore(initial)
  manager = checkpoint.CheckpointManager(str(tmp_path / 'ckpt'))
  restored = manager.restore_latest([np.zeros(3, np.float32)], store)
  assert restored.round_num == 3
  for c, leaves in states.items():
    for got, want in zip(store.get(c), leaves):
      np.testing.assert_array_equal(got, want)
