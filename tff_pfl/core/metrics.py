"""Evaluation metrics from per-client statistics (NumPy, outside TFF).

Client evaluation inside TFF returns sufficient statistics per client: a
confusion matrix for classification, error sums for regression, plus the loss
sum and example count. This module turns them into per-client metrics
(accuracy, macro-F1; MAE, RMSE) and into the summaries the papers report over
clients: the plain mean over clients (Eq. 10 of FedPSD: every client counts
once), the sample-weighted mean, the standard deviation and the mean of the
worst 10% of clients.
"""

import collections
from collections.abc import Mapping, Sequence
import math
from typing import Any

import numpy as np

CLASSIFICATION_METRICS = ('accuracy', 'macro_f1', 'loss')
REGRESSION_METRICS = ('mae', 'rmse', 'loss')
# For each metric, whether larger is better (decides "worst 10%" and "best").
HIGHER_IS_BETTER = {'accuracy': True, 'macro_f1': True, 'loss': False,
                    'mae': False, 'rmse': False}


def macro_f1(confusion: np.ndarray) -> float:
  """Macro-F1 over the classes present in labels or predictions.

  Classes that appear neither as a true label nor as a prediction on this
  client are left out (their F1 is undefined), as scikit-learn does when the
  `labels` argument is the set of observed classes.

  Args:
    confusion: `[K, K]` counts, rows true class, columns predicted class.
  """
  confusion = np.asarray(confusion, dtype=np.float64)
  tp = np.diag(confusion)
  support = confusion.sum(axis=1)
  predicted = confusion.sum(axis=0)
  present = (support + predicted) > 0
  if not present.any():
    return float('nan')
  denom = support + predicted
  f1 = np.where(denom > 0, 2 * tp / np.maximum(denom, 1e-12), 0.0)
  return float(f1[present].mean())


def client_metrics(stats: Mapping[str, Any]) -> dict[str, float]:
  """Metrics of one client from its evaluation statistics."""
  n = float(stats['num_examples'])
  if n <= 0:
    raise ValueError('cannot evaluate a client with no test examples.')
  out = {'num_examples': n, 'loss': float(stats['loss_sum']) / n}
  if 'confusion' in stats:
    confusion = np.asarray(stats['confusion'])
    out['accuracy'] = float(np.trace(confusion) / n)
    out['macro_f1'] = macro_f1(confusion)
  else:
    out['mae'] = float(stats['abs_error_sum']) / n
    out['rmse'] = math.sqrt(float(stats['sq_error_sum']) / n)
  return out


def summarize(per_client: Sequence[Mapping[str, float]]) -> dict[str, float]:
  """Summaries over clients: mean, weighted, std, worst10 for each metric.

  Clients whose value of a metric is not finite (e.g. the loss of a
  diverged personal model) are left out of that metric's summaries and
  counted in `<metric>_non_finite_clients` (present only when > 0); when
  no client's value is finite the summaries are NaN.
  """
  if not per_client:
    raise ValueError('no clients to summarize.')
  weights = np.array([c['num_examples'] for c in per_client], np.float64)
  out = collections.OrderedDict()
  names = [k for k in per_client[0] if k != 'num_examples']
  for name in names:
    values = np.array([c[name] for c in per_client], np.float64)
    finite = np.isfinite(values)
    v, w = values[finite], weights[finite]
    if v.size < values.size:
      out[f'{name}_non_finite_clients'] = float(values.size - v.size)
    if v.size == 0:
      for stat in ('mean', 'weighted', 'std', 'worst10'):
        out[f'{name}_{stat}'] = math.nan
      continue
    out[f'{name}_mean'] = float(v.mean())
    out[f'{name}_weighted'] = float((v * w).sum() / w.sum())
    out[f'{name}_std'] = float(v.std())
    k = max(1, int(math.ceil(0.1 * v.size)))
    ordered = np.sort(v)
    worst = ordered[:k] if HIGHER_IS_BETTER.get(name, True) else ordered[-k:]
    out[f'{name}_worst10'] = float(worst.mean())
  return out
