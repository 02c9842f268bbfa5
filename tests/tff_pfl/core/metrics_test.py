"""Tests for tff_pfl.core.metrics."""

import numpy as np
import pytest
from sklearn import metrics as skm

from tff_pfl.core import metrics


def test_macro_f1_matches_sklearn_on_observed_classes():
  rng = np.random.default_rng(0)
  y = rng.integers(0, 4, 200)
  p = np.where(rng.random(200) < 0.7, y, rng.integers(0, 5, 200))
  confusion = skm.confusion_matrix(y, p, labels=range(6))
  observed = sorted(set(y) | set(p))
  expected = skm.f1_score(y, p, average='macro', labels=observed)
  assert metrics.macro_f1(confusion) == pytest.approx(expected)


def test_client_metrics_classification_and_regression():
  c = metrics.client_metrics(
      {'confusion': np.array([[3, 1], [0, 4]]), 'loss_sum': 4.0,
       'num_examples': 8.0})
  assert c['accuracy'] == pytest.approx(7 / 8)
  assert c['loss'] == pytest.approx(0.5)
  r = metrics.client_metrics({'abs_error_sum': 6.0, 'sq_error_sum': 18.0,
                              'loss_sum': 18.0, 'num_examples': 2.0})
  assert r['mae'] == pytest.approx(3.0)
  assert r['rmse'] == pytest.approx(3.0)


def test_client_without_examples_raises():
  with pytest.raises(ValueError, match='no test examples'):
    metrics.client_metrics({'confusion': np.zeros((2, 2)), 'loss_sum': 0.0,
                            'num_examples': 0.0})


def test_summaries_mean_weighted_std_worst():
  clients = [{'num_examples': n, 'accuracy': a, 'loss': l}
             for n, a, l in [(10, 0.9, 0.1), (30, 0.5, 1.0), (10, 0.7, 0.4),
                             (50, 0.8, 0.2)]]
  s = metrics.summarize(clients)
  assert s['accuracy_mean'] == pytest.approx(0.725)
  assert s['accuracy_weighted'] == pytest.approx(
      (9 + 15 + 7 + 40) / 100)
  assert s['accuracy_std'] == pytest.approx(np.std([0.9, 0.5, 0.7, 0.8]))
  assert s['accuracy_worst10'] == pytest.approx(0.5)   # lowest accuracy
  assert s['loss_worst10'] == pytest.approx(1.0)       # highest loss
  assert not any(k.endswith('_non_finite_clients') for k in s)


def test_non_finite_client_values_are_left_out_and_counted():
  clients = [{'num_examples': 10, 'accuracy': 0.9, 'loss': float('nan')},
             {'num_examples': 30, 'accuracy': 0.5, 'loss': 0.4},
             {'num_examples': 10, 'accuracy': 0.7, 'loss': float('inf')}]
  s = metrics.summarize(clients)
  assert s['loss_non_finite_clients'] == 2
  assert s['loss_mean'] == s['loss_weighted'] == pytest.approx(0.4)
  assert s['accuracy_mean'] == pytest.approx(0.7)
  assert 'accuracy_non_finite_clients' not in s
  # No finite value at all: NaN summaries, not missing keys.
  s = metrics.summarize([{'num_examples': 5, 'loss': float('nan')}])
  assert s['loss_non_finite_clients'] == 1
  assert all(np.isnan(s[f'loss_{stat}'])
             for stat in ('mean', 'weighted', 'std', 'worst10'))
