"""Seeded client assignment schemes (pure NumPy).

Each scheme maps integer labels to one sorted int64 index array per client
and draws all randomness from `np.random.default_rng(seed)`:

*   `partition_iid`: uniform random, equal sizes.
*   `partition_dirichlet`: per class, client shares drawn from Dir(alpha)
    (the LDA scheme of FedPSD and the Dirichlet setting of AFedCL).
*   `partition_disjoint`: AFedCL's "Disjoint" setting, c classes per client.
*   `partition_shards`: FedPSD's pathological sharding, S shards per client.
*   `cap_samples`: at most k samples per client (AFedCL's k = 5/10/20).

`tff_pfl.data.partition` re-exports all of them.
"""

from collections.abc import Sequence
from typing import Any

import numpy as np


def client_id(index: int) -> str:
  """The id of the client at `index`: 'client_000', 'client_001', ..."""
  return f'client_{index:03d}'


def check_labels(labels: Any) -> np.ndarray:
  """Validates 1-D non-negative integer labels; returns them as int64."""
  labels = np.asarray(labels)
  if labels.ndim != 1:
    raise ValueError(f'labels must be 1-D, got shape {labels.shape}.')
  if labels.size == 0:
    raise ValueError('labels is empty: there is nothing to partition.')
  if not np.issubdtype(labels.dtype, np.integer):
    raise ValueError(
        f'labels must be integer class ids, got dtype {labels.dtype}. For '
        'regression targets pass bin_targets(y) (or zeros for IID).'
    )
  if labels.min() < 0:
    raise ValueError(f'labels must be >= 0, found {labels.min()}.')
  return labels.astype(np.int64, copy=False)


def _check_num_clients(num_clients: int, num_samples: int):
  if not isinstance(num_clients, (int, np.integer)) or num_clients < 1:
    raise ValueError(f'num_clients must be an int >= 1, got {num_clients!r}.')
  if num_clients > num_samples:
    raise ValueError(
        f'num_clients={num_clients} exceeds the {num_samples} samples: some '
        'clients would be left empty.'
    )


def _sorted_parts(parts: Sequence[Sequence[np.ndarray]]) -> list[np.ndarray]:
  out = []
  for chunks in parts:
    if len(chunks):
      out.append(np.sort(np.concatenate(chunks)).astype(np.int64))
    else:
      out.append(np.zeros(0, dtype=np.int64))
  return out


def _largest_remainder(
    weights: np.ndarray, total: int, rng: np.random.Generator
) -> np.ndarray:
  """Splits `total` into integers proportional to `weights` (ties random)."""
  quota = weights * total / weights.sum()
  alloc = np.floor(quota).astype(np.int64)
  short = total - int(alloc.sum())
  if short > 0:
    frac = quota - alloc
    order = np.lexsort((rng.random(len(weights)), -frac))
    alloc[order[:short]] += 1
  return alloc


def bin_targets(y: Any, num_bins: int = 5) -> np.ndarray:
  """Bins regression targets into `num_bins` quantile classes (int64).

  Lets the label-aware schemes (Dirichlet, stratified splits) work on
  regression data: pass the result as `labels`.

  Args:
    y: Real-valued targets, shape [N].
    num_bins: Number of (roughly equally populated) bins.

  Returns:
    An int64 array of bin ids in [0, num_bins).

  Raises:
    ValueError: If `num_bins` < 1 or `y` is not 1-D.
  """
  y = np.asarray(y, dtype=np.float64)
  if y.ndim != 1:
    raise ValueError(f'y must be 1-D, got shape {y.shape}.')
  if num_bins < 1:
    raise ValueError(f'num_bins must be >= 1, got {num_bins}.')
  edges = np.quantile(y, np.linspace(0, 1, num_bins + 1)[1:-1])
  return np.searchsorted(edges, y, side='right').astype(np.int64)


def partition_iid(
    labels: Any, num_clients: int, seed: int
) -> list[np.ndarray]:
  """Shuffles the samples and deals them out in near-equal parts.

  Args:
    labels: Integer labels, shape [N] (only the length is used).
    num_clients: Number of clients, 1 <= num_clients <= N.
    seed: Seed for `np.random.default_rng`.

  Returns:
    One sorted int64 index array per client; together they cover every
    sample exactly once.

  Raises:
    ValueError: If `num_clients` is < 1 or larger than N.
  """
  labels = check_labels(labels)
  _check_num_clients(num_clients, len(labels))
  rng = np.random.default_rng(seed)
  perm = rng.permutation(len(labels))
  return [
      np.sort(p).astype(np.int64) for p in np.array_split(perm, num_clients)
  ]


def partition_dirichlet(
    labels: Any,
    num_clients: int,
    alpha: float,
    seed: int,
    min_samples: int = 10,
    max_tries: int = 1000,
    *,
    balance: bool = True,
) -> list[np.ndarray]:
  """Dirichlet (LDA) label skew: per class, shares drawn from Dir(alpha).

  For every class the samples are shuffled and cut according to
  proportions p ~ Dir(alpha * 1_K) over the K clients. Smaller alpha gives
  more skew. With `balance` (the NIID-Bench/PFLlib procedure used by FedPSD
  and most PFL code bases) a client that already holds more than N/K
  samples gets no share of the following classes, which keeps client sizes
  in check. The draw is repeated until every client has at least
  `min_samples` samples.

  Args:
    labels: Integer labels, shape [N].
    num_clients: Number of clients K.
    alpha: Dirichlet concentration, > 0.
    seed: Seed for `np.random.default_rng`.
    min_samples: Smallest acceptable client size, >= 1.
    max_tries: How many draws to try before giving up.
    balance: Apply the N/K cap described above.

  Returns:
    One sorted int64 index array per client covering every sample once.

  Raises:
    ValueError: If alpha <= 0, min_samples < 1, K * min_samples > N, or no
      draw within `max_tries` gives every client `min_samples` samples.
  """
  labels = check_labels(labels)
  _check_num_clients(num_clients, len(labels))
  if not np.isfinite(alpha) or alpha <= 0:
    raise ValueError(f'alpha must be a positive number, got {alpha!r}.')
  if min_samples < 1:
    raise ValueError(f'min_samples must be >= 1, got {min_samples}.')
  if max_tries < 1:
    raise ValueError(f'max_tries must be >= 1, got {max_tries}.')
  n = len(labels)
  if num_clients * min_samples > n:
    raise ValueError(
        f'Cannot give each of {num_clients} clients min_samples='
        f'{min_samples} samples: there are only {n}.'
    )
  rng = np.random.default_rng(seed)
  by_class = [np.flatnonzero(labels == c) for c in np.unique(labels)]
  best = 0
  for _ in range(max_tries):
    chunks = [[] for _ in range(num_clients)]
    sizes = np.zeros(num_clients, dtype=np.int64)
    for idx in by_class:
      idx = rng.permutation(idx)
      p = rng.dirichlet(np.full(num_clients, float(alpha)))
      if balance:
        p = p * (sizes < n / num_clients)
      if not np.isfinite(p).all() or p.sum() <= 0:
        # Only clients already over N/K got mass (alpha tiny): spread evenly.
        p = (sizes < n / num_clients).astype(np.float64)
      p = p / p.sum()
      cuts = (np.cumsum(p) * len(idx)).astype(np.int64)[:-1]
      for k, part in enumerate(np.split(idx, cuts)):
        chunks[k].append(part)
        sizes[k] += len(part)
    if sizes.min() >= min_samples:
      return _sorted_parts(chunks)
    best = max(best, int(sizes.min()))
  raise ValueError(
      f'partition_dirichlet: no draw in max_tries={max_tries} gave every one '
      f'of {num_clients} clients min_samples={min_samples} samples (alpha='
      f'{alpha}, {n} samples; the best draw had a client with {best}). Raise '
      'alpha, lower min_samples or use fewer clients.'
  )


def partition_disjoint(
    labels: Any, num_clients: int, classes_per_client: int, seed: int
) -> list[np.ndarray]:
  """AFedCL's "Disjoint" setting: every client holds exactly c classes.

  AFedCL allocates c random classes to each of its 5 clients with c = 2, 3,
  4 on data sets of 6, 7 and 10 classes, so K * c exceeds the number of
  classes and a class is necessarily held by several clients: "disjoint"
  means that clients see different class subsets, not that the subsets never
  overlap. Here each client draws c distinct classes among the least used
  ones so far (ties broken at random). Hence class sets are pairwise
  disjoint whenever K * c <= number of classes, and otherwise every class
  is held by floor or ceil(K * c / C) clients. The samples of a class are
  shuffled and split evenly among its holders, so no sample is shared.
  Classes no client draws (only when K * c < C) stay unassigned.

  Args:
    labels: Integer labels, shape [N].
    num_clients: Number of clients K.
    classes_per_client: c, at most the number of classes present.
    seed: Seed for `np.random.default_rng`.

  Returns:
    One sorted int64 index array per client.

  Raises:
    ValueError: If c < 1, c exceeds the classes present in `labels`, or a
      class has fewer samples than clients holding it.
  """
  labels = check_labels(labels)
  _check_num_clients(num_clients, len(labels))
  classes = np.unique(labels)
  c = classes_per_client
  if not isinstance(c, (int, np.integer)) or c < 1:
    raise ValueError(f'classes_per_client must be an int >= 1, got {c!r}.')
  if c > len(classes):
    raise ValueError(
        f'classes_per_client={c} exceeds the {len(classes)} classes present '
        'in labels.'
    )
  rng = np.random.default_rng(seed)
  usage = np.zeros(len(classes), dtype=np.int64)
  holders = [[] for _ in classes]
  for k in range(num_clients):
    order = np.lexsort((rng.random(len(classes)), usage))
    for ci in order[:c]:
      usage[ci] += 1
      holders[ci].append(k)
  chunks = [[] for _ in range(num_clients)]
  for ci, cls in enumerate(classes):
    if not holders[ci]:
      continue
    idx = rng.permutation(np.flatnonzero(labels == cls))
    if len(idx) < len(holders[ci]):
      raise ValueError(
          f'Class {cls} has {len(idx)} samples but {len(holders[ci])} '
          'clients hold it; use fewer clients or classes_per_client.'
      )
    for k, part in zip(holders[ci], np.array_split(idx, len(holders[ci]))):
      chunks[k].append(part)
  return _sorted_parts(chunks)


def partition_shards(
    labels: Any, num_clients: int, shards_per_client: int, seed: int
) -> list[np.ndarray]:
  """Pathological sharding (McMahan et al.; FedPSD): S shards per client.

  The samples are sorted by label and cut into K * S shards of (nearly)
  N / (K * S) samples; each client receives S shards at random. Unlike a
  plain cut of the sorted array, shards never straddle two classes: each
  class is cut into a number of shards proportional to its size (at least
  one), so a client has at most S classes, as FedPSD intends ("the number of
  shards ... corresponding to the number of categories each client has").
  With class sizes that are multiples of N / (K * S) (e.g. CIFAR-10 with
  K * S = 200) this is exactly the sort-and-cut procedure. Every sample is
  assigned once.

  Args:
    labels: Integer labels, shape [N].
    num_clients: Number of clients K.
    shards_per_client: S >= 1.
    seed: Seed for `np.random.default_rng`.

  Returns:
    One sorted int64 index array per client covering every sample once.

  Raises:
    ValueError: If S < 1, K * S exceeds N, or K * S is smaller than the
      number of classes (some class would get no shard).
  """
  labels = check_labels(labels)
  _check_num_clients(num_clients, len(labels))
  s = shards_per_client
  if not isinstance(s, (int, np.integer)) or s < 1:
    raise ValueError(f'shards_per_client must be an int >= 1, got {s!r}.')
  num_shards = num_clients * s
  n = len(labels)
  if num_shards > n:
    raise ValueError(
        f'num_clients * shards_per_client = {num_shards} shards exceed the '
        f'{n} samples.'
    )
  classes, counts = np.unique(labels, return_counts=True)
  if num_shards < len(classes):
    raise ValueError(
        f'num_clients * shards_per_client = {num_shards} shards cannot cover '
        f'the {len(classes)} classes (every shard holds a single class).'
    )
  rng = np.random.default_rng(seed)
  alloc = _shards_per_class(counts, num_shards)
  shards = []
  for cls, a in zip(classes, alloc):
    idx = rng.permutation(np.flatnonzero(labels == cls))
    shards.extend(np.array_split(idx, a))
  order = rng.permutation(num_shards)
  return _sorted_parts(
      [[shards[j] for j in order[k * s : (k + 1) * s]]
       for k in range(num_clients)]
  )


def _shards_per_class(counts: np.ndarray, num_shards: int) -> np.ndarray:
  """Deterministic largest-remainder split of shards, 1 <= a_c <= n_c."""
  quota = counts * num_shards / counts.sum()
  alloc = np.clip(np.floor(quota).astype(np.int64), 1, counts)
  while alloc.sum() > num_shards:
    excess = np.where(alloc > 1, alloc - quota, -np.inf)
    alloc[int(np.argmax(excess))] -= 1
  while alloc.sum() < num_shards:
    deficit = np.where(alloc < counts, quota - alloc, -np.inf)
    alloc[int(np.argmax(deficit))] += 1
  return alloc


def cap_samples(
    parts: Sequence[np.ndarray],
    labels: Any,
    k: int,
    seed: int,
    *,
    strict: bool = True,
) -> list[np.ndarray]:
  """Keeps at most `k` samples per client (AFedCL: k training samples each).

  The cap is on each client's total, as in AFedCL ("the number of training
  samples per client is set to 5, 10, and 20"), not per class. The kept
  samples are drawn at random but stratified: each class keeps a share of
  the k proportional to its share of the client's samples (largest
  remainder rounding), so a client's label mix survives the cap.

  Args:
    parts: Per-client index arrays.
    labels: Integer labels of the pooled data set.
    k: The cap, >= 1.
    seed: Seed for `np.random.default_rng`.
    strict: If True a client with fewer than `k` samples is an error;
      otherwise it keeps all its samples.

  Returns:
    Sorted int64 index arrays, each a subset of the input one.

  Raises:
    ValueError: If k < 1, or `strict` and a client has fewer than k.
  """
  labels = check_labels(labels)
  if not isinstance(k, (int, np.integer)) or k < 1:
    raise ValueError(f'k must be an int >= 1, got {k!r}.')
  rng = np.random.default_rng(seed)
  out = []
  for i, part in enumerate(parts):
    part = np.asarray(part, dtype=np.int64)
    if len(part) <= k:
      if len(part) < k and strict:
        raise ValueError(
            f'{client_id(i)} has {len(part)} samples, fewer than the k={k} '
            'requested (pass strict=False to keep them all).'
        )
      out.append(np.sort(part))
      continue
    part_labels = labels[part]
    classes, counts = np.unique(part_labels, return_counts=True)
    alloc = _largest_remainder(counts.astype(np.float64), k, rng)
    kept = [
        rng.choice(part[part_labels == c], size=a, replace=False)
        for c, a in zip(classes, alloc)
        if a
    ]
    out.append(np.sort(np.concatenate(kept)).astype(np.int64))
  return out
