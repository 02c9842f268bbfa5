"""Client-state stores: where per-client state lives between rounds.

TFF clients are stateless, so a personalized process takes the sampled
clients' states as a CLIENTS-placed argument and returns the new ones; the
store keeps them, keyed by client id, in between. A client's initial state is
created the first time it is asked for.

`MemoryStore` keeps every state in a dict. `DiskStore` writes one `.npz` file
per client (atomically: a temporary file then `os.replace`) and keeps none in
memory, so memory does not grow with the number of registered clients.
"""

import abc
from collections.abc import Callable, Iterator, Mapping, Sequence
import os
import tempfile
from typing import Any

import numpy as np
import tensorflow as tf

InitialStateFn = Callable[[str], Any]


def _flatten(state: Any) -> list[np.ndarray]:
  return [np.asarray(leaf) for leaf in tf.nest.flatten(state)]


class ClientStateStore(abc.ABC):
  """Maps client ids to client states (nested structures of arrays)."""

  def __init__(self, initial_state_fn: InitialStateFn):
    self._initial_state_fn = initial_state_fn
    self._template = None

  def _structure(self) -> Any:
    if self._template is None:
      self._template = self._initial_state_fn('__template__')
    return self._template

  def get(self, client_id: str) -> Any:
    """The state of `client_id`, its initial state on first use."""
    state = self._load(client_id)
    if state is None:
      state = self._initial_state_fn(client_id)
    return state

  def put(self, client_id: str, state: Any) -> None:
    """Stores `state`; it must have the structure of an initial state."""
    tf.nest.assert_same_structure(self._structure(), state,
                                  check_types=False)
    self._save(client_id, state)

  def get_many(self, client_ids: list[str]) -> list[Any]:
    return [self.get(c) for c in client_ids]

  def put_many(self, client_ids: list[str], states: list[Any]) -> None:
    if len(client_ids) != len(states):
      raise ValueError(f'{len(client_ids)} client ids but {len(states)} '
                       'states.')
    for c, s in zip(client_ids, states):
      self.put(c, s)

  @abc.abstractmethod
  def _load(self, client_id: str) -> Any:
    """The stored state or None."""

  @abc.abstractmethod
  def _save(self, client_id: str, state: Any) -> None:
    """Stores the state."""

  @abc.abstractmethod
  def client_ids(self) -> Iterator[str]:
    """Ids of the clients with a stored (non-initial) state."""

  def items(self) -> Iterator[tuple[str, list[np.ndarray]]]:
    """`(client id, flat arrays)` of every stored state, loaded one at a
    time (a checkpoint streams a `DiskStore` through this)."""
    for c in self.client_ids():
      yield c, _flatten(self._load(c))

  def snapshot(self) -> dict[str, list[np.ndarray]]:
    """Every stored state as flat arrays, all in memory at once."""
    return dict(self.items())

  def restore(self, snapshot: Mapping[str, Sequence[np.ndarray]]) -> None:
    """Replaces the stored states with those of a snapshot.

    `snapshot` is read twice, one entry at a time (checked, then stored),
    and no entry is kept: a lazy mapping over a checkpoint file restores
    into a `DiskStore` holding one client's state at a time. An error while
    storing (a full disk, an interrupt) can leave the store part restored;
    the run then stops, and the next resume restores it again from the
    checkpoint.

    Raises:
      ValueError: naming the first client whose flat state does not have the
        number of tensors of an initial state, or a tensor of another rank
        (a checkpoint that a different algorithm, model or code version
        wrote); found before anything is replaced, so the stored states
        are then left as they were. Dimensions
        are not compared: some states grow (FedPSD's stored predictions
        start with 0 rows and hold one per training sample).
    """
    structure = self._structure()
    ranks = [np.ndim(t) for t in _flatten(structure)]
    for c, leaves in snapshot.items():
      got = [np.ndim(t) for t in leaves]
      if got != ranks:
        raise ValueError(
            f'the saved state of client {c!r} does not fit this algorithm '
            f'and model: {len(got)} tensors of ranks {got}, expected '
            f'{len(ranks)} of ranks {ranks} (a different algorithm, model '
            'or code version wrote it); use a fresh checkpoint directory.')
    self.clear()
    for c, leaves in snapshot.items():
      self._save(c, tf.nest.pack_sequence_as(structure, list(leaves)))

  @abc.abstractmethod
  def clear(self) -> None:
    """Forgets every stored state."""


class MemoryStore(ClientStateStore):
  """Keeps client states in a dict."""

  def __init__(self, initial_state_fn: InitialStateFn):
    super().__init__(initial_state_fn)
    self._states: dict[str, Any] = {}

  def _load(self, client_id):
    return self._states.get(client_id)

  def _save(self, client_id, state):
    self._states[client_id] = tf.nest.map_structure(np.asarray, state)

  def client_ids(self):
    return iter(sorted(self._states))

  def clear(self):
    self._states.clear()


class DiskStore(ClientStateStore):
  """One `.npz` file per client under `directory`; nothing kept in memory."""

  def __init__(self, initial_state_fn: InitialStateFn, directory: str):
    super().__init__(initial_state_fn)
    self._dir = directory
    os.makedirs(directory, exist_ok=True)

  def _path(self, client_id: str) -> str:
    if not client_id or os.sep in client_id or client_id.startswith('.'):
      raise ValueError(f'client id {client_id!r} cannot name a file.')
    return os.path.join(self._dir, client_id + '.npz')

  def _load(self, client_id):
    path = self._path(client_id)
    if not os.path.exists(path):
      return None
    with np.load(path) as f:
      leaves = [f[f'leaf_{i}'] for i in range(len(f.files))]
    return tf.nest.pack_sequence_as(self._structure(), leaves)

  def _save(self, client_id, state):
    leaves = _flatten(state)
    fd, tmp = tempfile.mkstemp(dir=self._dir, suffix='.tmp')
    try:
      with os.fdopen(fd, 'wb') as f:
        np.savez(f, **{f'leaf_{i}': v for i, v in enumerate(leaves)})
      os.replace(tmp, self._path(client_id))
    except BaseException:
      if os.path.exists(tmp):
        os.remove(tmp)
      raise

  def client_ids(self):
    names = sorted(os.listdir(self._dir))
    return iter(n[:-4] for n in names if n.endswith('.npz'))

  def clear(self):
    for c in list(self.client_ids()):
      os.remove(self._path(c))
