"""Tests for tff_pfl.core.sampling."""

import pytest

from tff_pfl.core import sampling

IDS = [f'client_{i:03d}' for i in range(20)]


def test_same_seed_same_cohorts_and_rounds_differ():
  a = sampling.ParticipationStream(IDS, clients_per_round=5, seed=3)
  b = sampling.ParticipationStream(IDS, clients_per_round=5, seed=3)
  cohorts = [a.sample(r) for r in range(1, 11)]
  assert cohorts == [b.sample(r) for r in range(1, 11)]
  assert len({tuple(c) for c in cohorts}) > 1
  for c in cohorts:
    assert len(c) == 5 and len(set(c)) == 5 and set(c) <= set(IDS)


def test_order_of_queries_does_not_matter():
  """Resuming at round 7 gives the cohort an unstopped run had."""
  a = sampling.ParticipationStream(IDS, clients_per_round=4, seed=1)
  expected = [a.sample(r) for r in range(1, 9)][6]
  b = sampling.ParticipationStream(IDS, clients_per_round=4, seed=1)
  assert b.sample(7) == expected


def test_different_seed_differs():
  a = sampling.ParticipationStream(IDS, clients_per_round=5, seed=0)
  b = sampling.ParticipationStream(IDS, clients_per_round=5, seed=1)
  assert [a.sample(r) for r in range(1, 6)] != [b.sample(r)
                                                for r in range(1, 6)]


def test_full_participation_and_rate():
  a = sampling.ParticipationStream(IDS, clients_per_round=20, seed=0)
  assert a.sample(1) == IDS
  b = sampling.ParticipationStream.from_rate(IDS, rate=0.1, seed=0)
  assert b.clients_per_round == 2


@pytest.mark.parametrize('k', [0, 21])
def test_impossible_cohort_raises(k):
  with pytest.raises(ValueError, match='clients_per_round'):
    sampling.ParticipationStream(IDS, clients_per_round=k, seed=0)


def test_bad_inputs_raise():
  with pytest.raises(ValueError, match='at least one client'):
    sampling.ParticipationStream([], clients_per_round=1, seed=0)
  with pytest.raises(ValueError, match='unique'):
    sampling.ParticipationStream(['a', 'a'], clients_per_round=1, seed=0)
  with pytest.raises(ValueError, match='rate'):
    sampling.ParticipationStream.from_rate(IDS, rate=0.0, seed=0)
