"""Seeded partitioning of a labelled data set across federated clients.

Everything here is pure NumPy and deterministic given `seed` (each function
draws from its own `np.random.default_rng(seed)`). Indices refer to rows of
the pooled data set (`ArrayDataset.pooled()`).

Schemes, as used by the papers this library reproduces (defined in
`tff_pfl.data.schemes` and re-exported here):

*   `partition_iid`: uniform random, equal sizes.
*   `partition_dirichlet`: per class, client shares drawn from Dir(alpha)
    (the LDA scheme of FedPSD and the Dirichlet setting of AFedCL).
*   `partition_disjoint`: AFedCL's "Disjoint" setting, c classes per client.
*   `partition_shards`: FedPSD's pathological sharding, S shards per client.

`make_partition` chains a scheme with a per-client train/val/test split and
an optional cap on training samples per client (AFedCL's k = 5/10/20), and
returns a `Partition` that can be saved to and loaded from JSON.
"""

from collections.abc import Sequence
import dataclasses
import inspect
import json
import os
import pathlib
import tempfile
from typing import Any, Optional, Union

import numpy as np

from tff_pfl.data import schemes

SPLITS = ('train', 'val', 'test')
METHODS = ('iid', 'dirichlet', 'disjoint', 'shards')
_FORMAT = 'tff_pfl.partition'
_FORMAT_VERSION = 1

# The schemes live in `schemes`; they are part of this module's API.
bin_targets = schemes.bin_targets
cap_samples = schemes.cap_samples
check_labels = schemes.check_labels
client_id = schemes.client_id
partition_dirichlet = schemes.partition_dirichlet
partition_disjoint = schemes.partition_disjoint
partition_iid = schemes.partition_iid
partition_shards = schemes.partition_shards


def _check_fractions(train: float, val: float, test: float):
  for split, f in zip(SPLITS, (train, val, test)):
    if not np.isfinite(f) or f < 0 or f > 1:
      raise ValueError(f'{split} fraction must be in [0, 1], got {f!r}.')
  if train <= 0:
    raise ValueError(f'train fraction must be > 0, got {train!r}.')
  if abs(train + val + test - 1.0) > 1e-6:
    raise ValueError(
        f'train + val + test must be 1, got {train} + {val} + {test} = '
        f'{train + val + test}.'
    )


def _stratified_order(
    part: np.ndarray, labels: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
  """Orders `part` so that every prefix has about the client's class mix."""
  part_labels = labels[part]
  keys = np.empty(len(part), dtype=np.float64)
  for c in np.unique(part_labels):
    where = np.flatnonzero(part_labels == c)
    n_c = len(where)
    ranks = rng.permutation(n_c)
    keys[where] = (ranks + rng.random(n_c)) / n_c
  return part[np.argsort(keys, kind='stable')]


@dataclasses.dataclass(eq=False)
class ClientSplit:
  """Sample indices of one client, per split (sorted int64 arrays)."""

  train: np.ndarray
  val: np.ndarray
  test: np.ndarray

  def __post_init__(self):
    for split in SPLITS:
      value = np.asarray(getattr(self, split))
      if value.size == 0:
        value = np.zeros(0, dtype=np.int64)
      if value.ndim != 1 or not np.issubdtype(value.dtype, np.integer):
        raise ValueError(
            f'ClientSplit.{split} must be a 1-D integer array, got shape '
            f'{value.shape} dtype {value.dtype}.'
        )
      setattr(self, split, value.astype(np.int64, copy=False))

  def get(self, split: str) -> np.ndarray:
    """The indices of `split` ('train', 'val' or 'test')."""
    if split not in SPLITS:
      raise ValueError(f'split must be one of {SPLITS}, got {split!r}.')
    return getattr(self, split)

  def __eq__(self, other: Any) -> bool:
    if not isinstance(other, ClientSplit):
      return NotImplemented
    return all(np.array_equal(self.get(s), other.get(s)) for s in SPLITS)


def split_clients(
    parts: Sequence[np.ndarray],
    labels: Any,
    *,
    train: float = 0.75,
    val: float = 0.0,
    test: float = 0.25,
    seed: int,
    stratify: bool = True,
) -> list[ClientSplit]:
  """Splits every client's samples into train/val/test.

  Split sizes are round(fraction * n) for val and test, but at least one
  sample for every non-zero fraction; train gets the rest. With `stratify`
  each split keeps the client's class proportions (up to one sample per
  class).

  Args:
    parts: Per-client index arrays.
    labels: Integer labels of the pooled data set.
    train: Fraction for training, > 0.
    val: Fraction for validation.
    test: Fraction for testing.
    seed: Seed for `np.random.default_rng`.
    stratify: Keep class proportions in every split.

  Returns:
    One `ClientSplit` per client.

  Raises:
    ValueError: If the fractions are invalid, or a client has too few
      samples to give every non-zero split at least one.
  """
  labels = check_labels(labels)
  _check_fractions(train, val, test)
  rng = np.random.default_rng(seed)
  out = []
  for i, part in enumerate(parts):
    part = np.asarray(part, dtype=np.int64)
    n = len(part)
    n_test = 0 if test == 0 else max(1, int(np.floor(test * n + 0.5)))
    n_val = 0 if val == 0 else max(1, int(np.floor(val * n + 0.5)))
    if n - n_test - n_val < 1:
      raise ValueError(
          f'{client_id(i)} has {n} samples: too few to give each non-empty '
          f'split (train={train}, val={val}, test={test}) at least one.'
      )
    if stratify:
      order = _stratified_order(part, labels, rng)
    else:
      order = rng.permutation(part)
    out.append(
        ClientSplit(
            train=np.sort(order[n_test + n_val :]),
            val=np.sort(order[n_test : n_test + n_val]),
            test=np.sort(order[:n_test]),
        )
    )
  return out


def _json_scalar(value: Any) -> Any:
  if isinstance(value, np.integer):
    return int(value)
  if isinstance(value, np.floating):
    return float(value)
  if isinstance(value, np.bool_):
    return bool(value)
  if isinstance(value, (list, tuple)):
    return [_json_scalar(v) for v in value]
  if isinstance(value, dict):
    return {str(k): _json_scalar(v) for k, v in value.items()}
  return value


def _dump_json(obj: Any, indent: int = 0) -> str:
  """JSON with nested objects indented but flat lists kept on one line."""
  pad = '  ' * (indent + 1)
  if isinstance(obj, dict) and obj:
    items = [
        f'{pad}{json.dumps(k)}: {_dump_json(v, indent + 1)}'
        for k, v in obj.items()
    ]
    return '{\n' + ',\n'.join(items) + '\n' + '  ' * indent + '}'
  if isinstance(obj, list) and any(isinstance(v, (dict, list)) for v in obj):
    items = [f'{pad}{_dump_json(v, indent + 1)}' for v in obj]
    return '[\n' + ',\n'.join(items) + '\n' + '  ' * indent + ']'
  return json.dumps(obj)


def _int_array(values: Any, what: str) -> np.ndarray:
  """`values` as int64, refusing non-integers (which a cast would
  truncate) with a ValueError naming `what`."""
  array = np.asarray(values)
  if array.size and not np.issubdtype(array.dtype, np.integer):
    raise ValueError(f'Malformed partition document: {what} must be '
                     f'integers, got dtype {array.dtype}.')
  return array.astype(np.int64)


@dataclasses.dataclass(eq=False)
class Partition:
  """A reproducible assignment of samples to clients and splits.

  Attributes:
    method: The scheme ('iid', 'dirichlet', 'disjoint', 'shards', or any
      name for hand-made partitions).
    params: JSON-serialisable parameters (scheme options, split fractions,
      train cap) recorded for provenance.
    seed: The seed the partition was made with.
    num_samples: Length of the pooled data set the indices refer to.
    num_classes: Number of classes (0 when unknown, e.g. regression).
    client_ids: 'client_000', 'client_001', ...
    clients: One `ClientSplit` per client id.
    labels: The labels the partition was made from, shape [num_samples]; used
      by `counts` and to check that a data set matches. Optional.
  """

  method: str
  params: dict[str, Any]
  seed: int
  num_samples: int
  num_classes: int
  client_ids: list[str]
  clients: list[ClientSplit]
  labels: Optional[np.ndarray] = None

  def __post_init__(self):
    self.client_ids = [str(c) for c in self.client_ids]
    self.clients = list(self.clients)
    if self.labels is not None:
      self.labels = np.asarray(self.labels)
    self.validate()

  @property
  def num_clients(self) -> int:
    """The number of clients."""
    return len(self.clients)

  def validate(self):
    """Checks internal consistency.

    Raises:
      ValueError: If ids and clients differ in number, ids repeat, an index
        is out of range, a sample is in two places, or labels disagree with
        `num_samples`/`num_classes`.
    """
    if len(self.client_ids) != len(self.clients):
      raise ValueError(
          f'Partition has {len(self.client_ids)} client ids but '
          f'{len(self.clients)} clients.'
      )
    if len(set(self.client_ids)) != len(self.client_ids):
      raise ValueError('Partition client ids are not unique.')
    if self.num_samples < 0 or self.num_classes < 0:
      raise ValueError(
          'Partition num_samples and num_classes must be >= 0, got '
          f'{self.num_samples} and {self.num_classes}.'
      )
    if self.labels is not None:
      if self.labels.shape != (self.num_samples,) or not np.issubdtype(
          self.labels.dtype, np.integer
      ):
        raise ValueError(
            f'Partition labels must be integers of shape ({self.num_samples},)'
            f', got {self.labels.dtype} {self.labels.shape}.'
        )
      self.labels = self.labels.astype(np.int64, copy=False)
      if self.num_samples and (
          self.labels.min() < 0 or self.labels.max() >= self.num_classes
      ):
        raise ValueError(
            f'Partition labels lie in [{self.labels.min()}, '
            f'{self.labels.max()}], outside [0, {self.num_classes}).'
        )
    owner = np.full(self.num_samples, -1, dtype=np.int64)
    for i, (cid, split) in enumerate(zip(self.client_ids, self.clients)):
      for s, name in enumerate(SPLITS):
        idx = split.get(name)
        if idx.size == 0:
          continue
        if idx.min() < 0 or idx.max() >= self.num_samples:
          bad = idx[(idx < 0) | (idx >= self.num_samples)][0]
          raise ValueError(
              f'{cid} {name} index {bad} is out of range for '
              f'{self.num_samples} samples.'
          )
        uniq, counts = np.unique(idx, return_counts=True)
        if (counts > 1).any():
          raise ValueError(
              f'Sample {uniq[counts > 1][0]} appears twice in {cid} {name}.'
          )
        taken = owner[idx] >= 0
        if taken.any():
          sample = idx[taken][0]
          prev = owner[sample]
          raise ValueError(
              f'Sample {sample} is in two places: '
              f'{self.client_ids[prev // 3]} {SPLITS[prev % 3]} and {cid} '
              f'{name}.'
          )
        owner[idx] = 3 * i + s

  def indices(self, split: str) -> list[np.ndarray]:
    """The per-client index arrays of `split`, in client id order."""
    return [c.get(split) for c in self.clients]

  def num_assigned(self) -> int:
    """How many samples belong to some client split."""
    return sum(len(c.get(s)) for c in self.clients for s in SPLITS)

  def counts(
      self, split: str = 'train', labels: Optional[Any] = None
  ) -> np.ndarray:
    """Per-client per-class sample counts, shape [num_clients, num_classes].

    Args:
      split: 'train', 'val' or 'test'.
      labels: Labels to count with; defaults to the stored `labels`.

    Raises:
      ValueError: If no labels are available or `split` is unknown.
    """
    labels = self.labels if labels is None else np.asarray(labels)
    if labels is None:
      raise ValueError('This partition stores no labels; pass labels=.')
    num_classes = max(self.num_classes, int(labels.max()) + 1)
    table = np.zeros((self.num_clients, num_classes), dtype=np.int64)
    for i, c in enumerate(self.clients):
      table[i] = np.bincount(labels[c.get(split)], minlength=num_classes)
    return table

  def to_dict(self) -> dict[str, Any]:
    """A JSON-ready dict (see `save` for the layout)."""
    out = {
        'format': _FORMAT,
        'version': _FORMAT_VERSION,
        'method': self.method,
        'params': _json_scalar(dict(self.params)),
        'seed': _json_scalar(self.seed),
        'num_samples': int(self.num_samples),
        'num_classes': int(self.num_classes),
        'client_ids': list(self.client_ids),
    }
    if self.labels is not None:
      tables = {s: self.counts(s) for s in SPLITS}
      out['class_counts'] = {
          cid: {s: tables[s][i].tolist() for s in SPLITS}
          for i, cid in enumerate(self.client_ids)
      }
    out['clients'] = {
        cid: {s: c.get(s).tolist() for s in SPLITS}
        for cid, c in zip(self.client_ids, self.clients)
    }
    out['labels'] = None if self.labels is None else self.labels.tolist()
    return out

  @classmethod
  def from_dict(cls, data: dict[str, Any]) -> 'Partition':
    """Inverse of `to_dict`; validates the result.

    Raises:
      ValueError: If the dict is not a partition, or is inconsistent.
    """
    if not isinstance(data, dict) or data.get('format') != _FORMAT:
      raise ValueError(f'Not a {_FORMAT} document.')
    if data.get('version') != _FORMAT_VERSION:
      raise ValueError(
          f'Unsupported partition format version {data.get("version")!r}; '
          f'this code reads version {_FORMAT_VERSION}.'
      )
    try:
      client_ids = list(data['client_ids'])
      clients_json = data['clients']
      if set(clients_json) != set(client_ids):
        raise ValueError(
            'Partition "clients" keys differ from "client_ids".'
        )
      clients = [
          ClientSplit(
              **{
                  s: _int_array(clients_json[cid][s], f'{cid} {s} indices')
                  for s in SPLITS
              }
          )
          for cid in client_ids
      ]
      labels = data.get('labels')
      partition = cls(
          method=data['method'],
          params=dict(data['params']),
          seed=data['seed'],
          num_samples=int(data['num_samples']),
          num_classes=int(data['num_classes']),
          client_ids=client_ids,
          clients=clients,
          labels=None if labels is None else _int_array(labels, 'labels'),
      )
    except (KeyError, TypeError) as e:
      raise ValueError(f'Malformed partition document: {e!r}.') from e
    table = data.get('class_counts')
    if table is not None and partition.labels is not None:
      for s in SPLITS:
        counts = partition.counts(s)
        for i, cid in enumerate(client_ids):
          try:
            recorded = list(table[cid][s])
          except (KeyError, TypeError) as e:
            raise ValueError(
                f'Malformed partition document: class_counts of {cid} {s} '
                f'missing or not a list ({e!r}).') from e
          if recorded != counts[i].tolist():
            raise ValueError(
                f'class_counts of {cid} {s} disagree with its indices.'
            )
    return partition

  def to_json(self) -> str:
    """Serialises to JSON text (see `save`)."""
    return _dump_json(self.to_dict()) + '\n'

  @classmethod
  def from_json(cls, text: str) -> 'Partition':
    """Parses `to_json` output; validates like `load`."""
    try:
      data = json.loads(text)
    except json.JSONDecodeError as e:
      raise ValueError(f'Partition JSON is not valid JSON: {e}') from e
    return cls.from_dict(data)

  def save(self, path: Union[str, os.PathLike]):
    """Writes the partition as JSON, atomically (temp file + rename).

    The document holds method, params, seed, sizes, the client ids, a
    per-client per-class count table for each split ('class_counts', for
    humans; checked on load), the indices per client and split ('clients')
    and the labels.

    Args:
      path: Destination file; parent folders are created.
    """
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = self.to_json()
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix='.tmp')
    try:
      with os.fdopen(fd, 'w', encoding='utf-8') as f:
        f.write(text)
      os.replace(tmp, path)
    except BaseException:
      if os.path.exists(tmp):
        os.remove(tmp)
      raise

  @classmethod
  def load(cls, path: Union[str, os.PathLike]) -> 'Partition':
    """Reads a partition written by `save`.

    Raises:
      FileNotFoundError: If `path` does not exist.
      ValueError: If the file is not a valid partition: indices out of
        range, a sample in two places, or counts that disagree.
    """
    path = pathlib.Path(path)
    if not path.exists():
      raise FileNotFoundError(f'No partition file at {str(path)!r}.')
    try:
      return cls.from_json(path.read_text(encoding='utf-8'))
    except ValueError as e:
      raise ValueError(f'{str(path)!r}: {e}') from e

  def __eq__(self, other: Any) -> bool:
    if not isinstance(other, Partition):
      return NotImplemented
    same_labels = (self.labels is None and other.labels is None) or (
        self.labels is not None
        and other.labels is not None
        and np.array_equal(self.labels, other.labels)
    )
    return (
        self.method == other.method
        and _json_scalar(dict(self.params)) == _json_scalar(dict(other.params))
        and self.seed == other.seed
        and self.num_samples == other.num_samples
        and self.num_classes == other.num_classes
        and self.client_ids == other.client_ids
        and self.clients == other.clients
        and same_labels
    )

  def summary(self) -> str:
    """A small text table: sizes and classes per client and split."""
    params = ', '.join(f'{k}={v}' for k, v in sorted(self.params.items()))
    lines = [
        f'Partition {self.method!r} ({params}) seed={self.seed}: '
        f'{self.num_clients} clients, {self.num_samples} samples, '
        f'{self.num_classes} classes'
    ]
    show_classes = self.labels is not None
    per_class = show_classes and 0 < self.num_classes <= 20
    header = f'{"client":<12}{"train":>7}{"val":>7}{"test":>7}'
    if show_classes:
      header += f'{"classes":>9}'
      train_counts = self.counts('train')
    if per_class:
      header += '  train per class'
    lines.append(header)
    totals = np.zeros(3, dtype=np.int64)
    for i, (cid, c) in enumerate(zip(self.client_ids, self.clients)):
      sizes = [len(c.get(s)) for s in SPLITS]
      totals += sizes
      row = f'{cid:<12}' + ''.join(f'{n:>7}' for n in sizes)
      if show_classes:
        row += f'{int((train_counts[i] > 0).sum()):>9}'
      if per_class:
        row += '  ' + ' '.join(str(n) for n in train_counts[i])
      lines.append(row)
    lines.append(f'{"total":<12}' + ''.join(f'{n:>7}' for n in totals))
    unassigned = self.num_samples - int(totals.sum())
    if unassigned:
      lines.append(f'unassigned: {unassigned} samples')
    return '\n'.join(lines)


_METHOD_FNS = {
    'iid': (partition_iid, ()),
    'dirichlet': (partition_dirichlet, ('alpha',)),
    'disjoint': (partition_disjoint, ('classes_per_client',)),
    'shards': (partition_shards, ('shards_per_client',)),
}


def _derived_seed(seed: int, stage: int) -> int:
  return int(np.random.SeedSequence([seed, stage]).generate_state(1)[0])


def make_partition(
    labels: Any,
    *,
    num_clients: int,
    method: str,
    seed: int,
    num_classes: Optional[int] = None,
    train: float = 0.75,
    val: float = 0.0,
    test: float = 0.25,
    max_train_samples: Optional[int] = None,
    stratify: bool = True,
    **method_params: Any,
) -> Partition:
  """Partitions samples across clients, then splits each client.

  Steps: the scheme `method` assigns samples to clients (with `seed`
  itself, so its client sets equal those of calling the scheme function
  directly); each client is split into train/val/test (`split_clients`);
  then, if `max_train_samples` is set, each client's training split is cut
  to that many samples (`cap_samples`, strict), as in AFedCL's k = 5/10/20.
  The samples the cap removes are left unassigned: test and val keep what
  the split gave them, so evaluation data does not change with k.

  Args:
    labels: Integer labels of the pooled data set, shape [N]. For
      regression use `bin_targets(y)`.
    num_clients: Number of clients.
    method: One of 'iid', 'dirichlet', 'disjoint', 'shards'.
    seed: Seed for all randomness.
    num_classes: Number of classes; defaults to max(labels) + 1.
    train: Per-client training fraction.
    val: Per-client validation fraction.
    test: Per-client test fraction.
    max_train_samples: Cap on training samples per client, or None.
    stratify: Keep each client's class mix in every split.
    **method_params: Options of the scheme: `alpha` (and `min_samples`,
      `max_tries`, `balance`) for 'dirichlet', `classes_per_client` for
      'disjoint', `shards_per_client` for 'shards'.

  Returns:
    A `Partition` that records labels and all parameters.

  Raises:
    ValueError: For an unknown method, missing or unknown method options,
      invalid fractions, a client left empty, or any error of the steps.
  """
  labels = check_labels(labels)
  if not isinstance(seed, (int, np.integer)) or seed < 0:
    raise ValueError(f'seed must be an int >= 0, got {seed!r}.')
  if num_classes is None:
    num_classes = int(labels.max()) + 1
  elif num_classes <= labels.max():
    raise ValueError(
        f'num_classes={num_classes} but labels go up to {labels.max()}.'
    )
  if method not in _METHOD_FNS:
    raise ValueError(f'Unknown method {method!r}; known: {list(METHODS)}.')
  fn, required = _METHOD_FNS[method]
  missing = [p for p in required if p not in method_params]
  if missing:
    raise ValueError(f'Method {method!r} needs {missing}.')
  accepted = set(inspect.signature(fn).parameters) - {
      'labels',
      'num_clients',
      'seed',
  }
  unknown = sorted(set(method_params) - accepted)
  if unknown:
    raise ValueError(
        f'Unknown option(s) {unknown} for method {method!r}; accepted: '
        f'{sorted(accepted)}.'
    )
  _check_fractions(train, val, test)
  parts = fn(labels, num_clients, seed=seed, **method_params)
  empty = [client_id(i) for i, p in enumerate(parts) if len(p) == 0]
  if empty:
    raise ValueError(f'Method {method!r} left client(s) {empty} empty.')
  splits = split_clients(
      parts,
      labels,
      train=train,
      val=val,
      test=test,
      seed=_derived_seed(seed, 1),
      stratify=stratify,
  )
  if max_train_samples is not None:
    for i, c in enumerate(splits):
      if len(c.train) < max_train_samples:
        raise ValueError(
            f'max_train_samples={max_train_samples}, but {client_id(i)} has '
            f'only {len(c.train)} training samples after the split.'
        )
    capped = cap_samples(
        [c.train for c in splits],
        labels,
        max_train_samples,
        seed=_derived_seed(seed, 2),
        strict=True,
    )
    splits = [
        ClientSplit(train=t, val=c.val, test=c.test)
        for t, c in zip(capped, splits)
    ]
  params = dict(method_params)
  params.update(
      num_clients=num_clients,
      train=train,
      val=val,
      test=test,
      max_train_samples=max_train_samples,
      stratify=stratify,
  )
  return Partition(
      method=method,
      params=_json_scalar(params),
      seed=seed,
      num_samples=len(labels),
      num_classes=num_classes,
      client_ids=[client_id(i) for i in range(len(splits))],
      clients=splits,
      labels=labels,
  )
