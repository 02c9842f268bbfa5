"""Seeded client sampling fixed in advance.

The cohort of round `r` is a pure function of `(seed, r)`, so every
algorithm run with the same seed sees the same clients in the same round,
and a resumed run resamples exactly the cohorts an unstopped run would.
"""

from collections.abc import Sequence

import numpy as np


class ParticipationStream:
  """Which clients take part in each round."""

  def __init__(self, client_ids: Sequence[str], *, clients_per_round: int,
               seed: int):
    """Builds the stream.

    Args:
      client_ids: all registered clients.
      clients_per_round: cohort size, 1 <= clients_per_round <= len(ids).
      seed: the run's seed.

    Raises:
      ValueError: on an empty client list or an impossible cohort size.
    """
    if not client_ids:
      raise ValueError('ParticipationStream needs at least one client id.')
    if len(set(client_ids)) != len(client_ids):
      raise ValueError('client ids must be unique.')
    if not 1 <= clients_per_round <= len(client_ids):
      raise ValueError(
          f'clients_per_round={clients_per_round} must be between 1 and the '
          f'number of clients ({len(client_ids)}).')
    self._ids = list(client_ids)
    self._k = int(clients_per_round)
    self._seed = int(seed)

  @classmethod
  def from_rate(cls, client_ids: Sequence[str], *, rate: float,
                seed: int) -> 'ParticipationStream':
    """A stream sampling `round(rate * N)` clients (at least one) a round."""
    if not 0.0 < rate <= 1.0:
      raise ValueError(f'participation rate must be in (0, 1], got {rate}.')
    k = max(1, int(round(rate * len(client_ids))))
    return cls(client_ids, clients_per_round=k, seed=seed)

  @property
  def clients_per_round(self) -> int:
    return self._k

  def sample(self, round_num: int) -> list[str]:
    """The cohort of round `round_num` (1-based), in a stable order."""
    if self._k == len(self._ids):
      return list(self._ids)
    rng = np.random.default_rng([self._seed, 0x5A3D, int(round_num)])
    chosen = np.sort(rng.choice(len(self._ids), size=self._k, replace=False))
    return [self._ids[i] for i in chosen]
