"""Tests for tff_pfl.core.client_state."""

import collections
import os
from typing import Any, NamedTuple

import numpy as np
import pytest

from tff_pfl.core import client_state


class State(NamedTuple):
  weights: Any
  visits: Any


def initial(client_id):
  del client_id
  return State(weights=[np.zeros((2, 3), np.float32), np.ones(3, np.float32)],
               visits=np.int32(0))


@pytest.fixture(params=['memory', 'disk'])
def store(request, tmp_path):
  if request.param == 'memory':
    return client_state.MemoryStore(initial)
  return client_state.DiskStore(initial, str(tmp_path / 'states'))


def test_initial_state_on_first_use_then_stored(store):
  s = store.get('client_001')
  assert int(s.visits) == 0
  assert list(store.client_ids()) == []
  new = State([np.full((2, 3), 2.0, np.float32), np.ones(3, np.float32)],
              np.int32(5))
  store.put('client_001', new)
  got = store.get('client_001')
  assert int(got.visits) == 5
  np.testing.assert_array_equal(got.weights[0], new.weights[0])
  assert list(store.client_ids()) == ['client_001']
  # Another client is untouched.
  assert int(store.get('client_002').visits) == 0


def test_wrong_structure_is_rejected(store):
  with pytest.raises((ValueError, TypeError)):
    store.put('c', State(weights=[np.zeros(1)], visits=np.int32(1)))


def test_snapshot_restore(store):
  store.put('a', State([np.ones((2, 3), np.float32), np.ones(3, np.float32)],
                       np.int32(1)))
  snap = store.snapshot()
  store.put('b', initial('b'))
  store.restore(snap)
  assert list(store.client_ids()) == ['a']
  assert int(store.get('a').visits) == 1


def test_a_snapshot_of_another_structure_is_refused_and_loses_nothing(store):
  kept = State([np.ones((2, 3), np.float32), np.ones(3, np.float32)],
               np.int32(4))
  store.put('a', kept)
  store.put('c', kept)
  changed = client_state._flatten(kept._replace(visits=np.int32(9)))  # pylint: disable=protected-access
  # One tensor more (a newer state type), then a tensor of another rank.
  for bad in (changed + [np.int32(-1)], [np.ones(6)] + changed[1:]):
    with pytest.raises(ValueError, match="client 'b'.*fresh checkpoint"):
      store.restore({'a': changed, 'b': bad})
    # Nothing was replaced: 'c' (not in the snapshot) and 'a' as they were.
    assert sorted(store.client_ids()) == ['a', 'c']
    assert int(store.get('a').visits) == 4


def test_a_snapshot_of_grown_tensors_is_restored(store):
  """States whose tensors grow (FedPSD's predictions: 0 rows initially,
  one per sample once trained) restore with their own dimensions."""
  grown = State([np.ones((5, 3), np.float32), np.ones(7, np.float32)],
                np.int32(2))
  store.restore({'a': client_state._flatten(grown)})  # pylint: disable=protected-access
  got = store.get('a')
  assert got.weights[0].shape == (5, 3) and got.weights[1].shape == (7,)
  assert int(got.visits) == 2


def test_disk_store_persists_and_keeps_nothing_in_memory(tmp_path):
  d = str(tmp_path / 's')
  a = client_state.DiskStore(initial, d)
  for i in range(50):
    a.put(f'c{i:02d}', State([np.full((2, 3), i, np.float32),
                               np.ones(3, np.float32)], np.int32(i)))
  # Only the structure template is held, never the per-client states.
  held = [v for v in vars(a).values() if isinstance(v, dict)]
  assert not held
  b = client_state.DiskStore(initial, d)
  assert int(b.get('c42').visits) == 42
  assert sorted(os.listdir(d))[0] == 'c00.npz'
  assert not [n for n in os.listdir(d) if n.endswith('.tmp')]


def test_disk_store_rejects_path_like_ids(tmp_path):
  store = client_state.DiskStore(initial, str(tmp_path))
  with pytest.raises(ValueError, match='cannot name a file'):
    store.put('../evil', initial('x'))
