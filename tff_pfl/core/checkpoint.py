"""Checkpoints of a personalized run: server state, client states, history.

A checkpoint after round k is a directory `round_<k>` holding
  server.npz   the server state's leaves (`tf.nest.flatten` order),
  clients.npz  every stored client state's leaves, keyed by client id,
  loop.json    the loop's history (round rows, client rows, best rounds).
The sampling stream and every data seed are pure functions of (seed, round),
so the round number is all the stream needs. A checkpoint is written into a
temporary directory and renamed into place (atomic on POSIX), and only the
newest `keep` checkpoints are kept; a temporary directory left by a run
killed while saving is removed when the next run opens the directory.

Client states stream through `clients.npz` one client at a time, in both
directions: with a `DiskStore`, saving and restoring hold one client's state
in memory, not all of them. The file is the one `np.savez` writes (a zip of
`<client id>/<leaf>.npy` entries), so checkpoints written before streaming
still restore. Leaves are written without pickling: a client state must
be numeric arrays (an object array fails at save time, not at restore).

Why not `tff.program.FileProgramStateManager`: it saves SavedModels of a
structure fixed in advance, while the set of clients with a stored state
grows as clients are first sampled, and it is much slower per save for large
models on 2 cores. The file layout here is plain NumPy and JSON, resumable
only by the same code version, as TFF's manager is.
"""

import collections.abc
from collections.abc import Iterator
import json
import os
import re
import shutil
import tempfile
from typing import Any, NamedTuple, Optional
import zipfile

import numpy as np
import tensorflow as tf

from tff_pfl.core import client_state

_NAME = re.compile(r'^round_(\d{6})$')


class Restored(NamedTuple):
  round_num: int
  server_state: Any
  loop_state: dict[str, Any]


def _complete_rounds(directory: str) -> list[int]:
  out = []
  for name in os.listdir(directory):
    m = _NAME.match(name)
    if m and os.path.exists(os.path.join(directory, name, 'loop.json')):
      out.append(int(m.group(1)))
  return sorted(out)


def newest_loop_state(directory: str) -> Optional[dict[str, Any]]:
  """The loop state (history, fingerprint, architecture, ...) of the newest
  complete checkpoint under `directory`, None if there is none; reads
  without creating anything, so that a program can check a run's
  checkpoints before it writes."""
  if not os.path.isdir(directory):
    return None
  rounds = _complete_rounds(directory)
  if not rounds:
    return None
  path = os.path.join(directory, f'round_{rounds[-1]:06d}', 'loop.json')
  with open(path) as f:
    return json.load(f)


def _write_clients(path: str, store: client_state.ClientStateStore) -> None:
  """Writes `np.savez`'s layout, one client's arrays at a time."""
  with zipfile.ZipFile(path, 'w', zipfile.ZIP_STORED,
                       allowZip64=True) as zf:
    for cid, leaves in store.items():
      for i, v in enumerate(leaves):
        with zf.open(f'{cid}/{i}.npy', 'w', force_zip64=True) as f:
          np.lib.format.write_array(f, np.asanyarray(v), allow_pickle=False)


class _SavedClients(collections.abc.Mapping):
  """The client states of an open `clients.npz`, read on access."""

  def __init__(self, npz: Any):
    self._npz = npz
    self._counts: dict[str, int] = {}
    for key in npz.files:
      cid, _ = key.rsplit('/', 1)
      self._counts[cid] = self._counts.get(cid, 0) + 1

  def __getitem__(self, cid: str) -> list[np.ndarray]:
    return [self._npz[f'{cid}/{i}'] for i in range(self._counts[cid])]

  def __iter__(self) -> Iterator[str]:
    return iter(self._counts)

  def __len__(self) -> int:
    return len(self._counts)


class CheckpointManager:
  """Saves and restores run checkpoints under `directory`."""

  def __init__(self, directory: str, keep: int = 2):
    if keep < 1:
      raise ValueError(f'keep must be >= 1, got {keep}.')
    self._dir = directory
    self._keep = keep
    os.makedirs(directory, exist_ok=True)
    for name in os.listdir(directory):   # left by a run killed mid-save
      if name.startswith('.tmp_'):
        shutil.rmtree(os.path.join(directory, name), ignore_errors=True)

  def rounds(self) -> list[int]:
    """Rounds with a complete checkpoint, ascending."""
    return _complete_rounds(self._dir)

  def save(self, round_num: int, server_state: Any,
           store: client_state.ClientStateStore,
           loop_state: dict[str, Any]) -> str:
    """Writes the checkpoint of `round_num`; returns its directory."""
    tmp = tempfile.mkdtemp(dir=self._dir, prefix='.tmp_')
    try:
      leaves = [np.asarray(v) for v in tf.nest.flatten(server_state)]
      np.savez(os.path.join(tmp, 'server.npz'),
               **{f'leaf_{i}': v for i, v in enumerate(leaves)})
      _write_clients(os.path.join(tmp, 'clients.npz'), store)
      with open(os.path.join(tmp, 'loop.json'), 'w') as f:
        json.dump(dict(loop_state, round_num=round_num), f)
      final = os.path.join(self._dir, f'round_{round_num:06d}')
      if os.path.exists(final):
        shutil.rmtree(final)
      os.rename(tmp, final)
    except BaseException:
      shutil.rmtree(tmp, ignore_errors=True)
      raise
    for old in self.rounds()[:-self._keep]:
      shutil.rmtree(os.path.join(self._dir, f'round_{old:06d}'))
    return final

  def restore_latest(self, server_state_template: Any,
                     store: client_state.ClientStateStore,
                     ) -> Optional[Restored]:
    """Loads the newest checkpoint into `store`; None if there is none.

    Raises:
      ValueError: when the checkpoint does not fit the template (a different
        algorithm, model or code version wrote it).
    """
    rounds = self.rounds()
    if not rounds:
      return None
    path = os.path.join(self._dir, f'round_{rounds[-1]:06d}')
    template_leaves = tf.nest.flatten(server_state_template)
    with np.load(os.path.join(path, 'server.npz')) as f:
      leaves = [f[f'leaf_{i}'] for i in range(len(f.files))]
    if len(leaves) != len(template_leaves) or any(
        np.shape(a) != np.shape(b) for a, b in zip(leaves, template_leaves)):
      raise ValueError(
          f'checkpoint {path} does not match this algorithm and model '
          f'({len(leaves)} server tensors vs {len(template_leaves)} '
          'expected); use a fresh checkpoint directory.')
    server_state = tf.nest.pack_sequence_as(server_state_template, leaves)
    with np.load(os.path.join(path, 'clients.npz')) as f:
      store.restore(_SavedClients(f))
    with open(os.path.join(path, 'loop.json')) as f:
      loop_state = json.load(f)
    return Restored(rounds[-1], server_state, loop_state)
