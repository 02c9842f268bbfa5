"""Property tests for tff_pfl.data.partition."""

import json

import numpy as np
import pytest

from tff_pfl.data import partition as P


def _balanced(num_classes=6, per_class=50):
  return np.repeat(np.arange(num_classes), per_class)


def _imbalanced(seed=0, n=600, num_classes=10, min_size=20):
  """Shuffled labels with skewed class sizes, each class >= min_size."""
  rng = np.random.default_rng(seed)
  extra = rng.multinomial(
      n - min_size * num_classes, rng.dirichlet(np.ones(num_classes))
  )
  return rng.permutation(np.repeat(np.arange(num_classes), extra + min_size))


LABEL_SETS = {
    'balanced': _balanced(),
    'imbalanced': _imbalanced(),
    'mnist_like': _imbalanced(seed=3, n=2000, num_classes=10),
}

SCHEMES = {
    'iid': lambda y, seed: P.partition_iid(y, 7, seed),
    'dirichlet': lambda y, seed: P.partition_dirichlet(y, 7, 0.3, seed),
    'shards': lambda y, seed: P.partition_shards(y, 7, 2, seed),
}


def _assert_disjoint(parts, num_samples, complete):
  everything = np.concatenate(parts)
  assert len(np.unique(everything)) == len(everything), 'sample twice'
  assert everything.min() >= 0 and everything.max() < num_samples
  if complete:
    assert len(everything) == num_samples, 'sample left out'
  for p in parts:
    assert p.dtype == np.int64
    assert np.all(np.diff(p) > 0), 'indices not sorted'


@pytest.mark.parametrize('scheme', sorted(SCHEMES))
@pytest.mark.parametrize('label_set', sorted(LABEL_SETS))
@pytest.mark.parametrize('seed', [0, 1, 2])
def test_schemes_assign_every_sample_once(scheme, label_set, seed):
  labels = LABEL_SETS[label_set]
  parts = SCHEMES[scheme](labels, seed)
  assert len(parts) == 7
  assert all(len(p) for p in parts)
  _assert_disjoint(parts, len(labels), complete=True)


@pytest.mark.parametrize('scheme', sorted(SCHEMES) + ['disjoint'])
def test_same_seed_same_partition_other_seed_differs(scheme):
  labels = LABEL_SETS['imbalanced']
  fn = SCHEMES.get(
      scheme, lambda y, seed: P.partition_disjoint(y, 7, 3, seed)
  )
  a, b, c = fn(labels, 5), fn(labels, 5), fn(labels, 6)
  assert all(np.array_equal(x, y) for x, y in zip(a, b))
  assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def test_iid_sizes_equal():
  parts = P.partition_iid(np.zeros(103, np.int64), 10, seed=0)
  sizes = [len(p) for p in parts]
  assert max(sizes) - min(sizes) <= 1 and sum(sizes) == 103


@pytest.mark.parametrize(
    'num_clients, c, num_classes',
    [(5, 2, 6), (5, 3, 7), (5, 4, 10), (3, 2, 6), (4, 1, 10), (10, 6, 6)],
)
@pytest.mark.parametrize('seed', [0, 1])
def test_disjoint_exactly_c_classes(num_clients, c, num_classes, seed):
  labels = _balanced(num_classes, 40)
  parts = P.partition_disjoint(labels, num_clients, c, seed)
  _assert_disjoint(parts, len(labels), complete=False)
  class_sets = [set(np.unique(labels[p])) for p in parts]
  assert all(len(s) == c for s in class_sets)
  usage = np.bincount(
      np.concatenate([list(s) for s in class_sets]), minlength=num_classes
  )
  if num_clients * c <= num_classes:
    # No class is shared.
    assert usage.max() == 1
  else:
    # Classes are spread evenly and every one is used.
    assert usage.min() >= 1 and usage.max() - usage.min() <= 1
    _assert_disjoint(parts, len(labels), complete=True)


def test_disjoint_afedcl_neu_setting():
  # NEU-CLS: 6 classes x 300 images, 5 clients with 2 classes each.
  labels = _balanced(6, 300)
  parts = P.partition_disjoint(labels, 5, 2, seed=0)
  counts = np.stack([np.bincount(labels[p], minlength=6) for p in parts])
  assert ((counts > 0).sum(axis=1) == 2).all()
  # A class held by two clients is split evenly between them.
  for cls in range(6):
    holders = counts[:, cls][counts[:, cls] > 0]
    assert holders.sum() == 300
    assert holders.max() - holders.min() <= 1


@pytest.mark.parametrize('label_set', sorted(LABEL_SETS))
@pytest.mark.parametrize('s', [1, 2, 3])
def test_shards_at_most_s_classes(label_set, s):
  labels = LABEL_SETS[label_set]
  num_clients = 10
  parts = P.partition_shards(labels, num_clients, s, seed=0)
  _assert_disjoint(parts, len(labels), complete=True)
  for p in parts:
    assert len(np.unique(labels[p])) <= s


def test_shards_equal_when_classes_divide():
  labels = _balanced(10, 100)  # 1000 samples, 50 shards of 20.
  parts = P.partition_shards(labels, 25, 2, seed=0)
  assert {len(p) for p in parts} == {40}


def test_dirichlet_min_samples_and_skew():
  labels = _balanced(10, 100)
  parts = P.partition_dirichlet(labels, 10, 0.1, seed=0, min_samples=20)
  assert min(len(p) for p in parts) >= 20
  iid = P.partition_iid(labels, 10, seed=0)

  def mean_classes(ps):
    return np.mean([len(np.unique(labels[p])) for p in ps])

  assert mean_classes(parts) < mean_classes(iid)


def test_dirichlet_without_balance():
  labels = _balanced(4, 50)
  parts = P.partition_dirichlet(labels, 4, 1.0, 0, min_samples=1, balance=False)
  _assert_disjoint(parts, len(labels), complete=True)


def test_dirichlet_tiny_alpha_still_valid():
  labels = _balanced(10, 30)
  parts = P.partition_dirichlet(labels, 5, 1e-3, seed=0, min_samples=1)
  _assert_disjoint(parts, len(labels), complete=True)


@pytest.mark.parametrize(
    'call, match',
    [
        (lambda y: P.partition_iid(y, 0, 0), 'num_clients must be'),
        (lambda y: P.partition_iid(y, 301, 0), 'some clients would be left'),
        (lambda y: P.partition_dirichlet(y, 5, 0.0, 0), 'alpha must be'),
        (lambda y: P.partition_dirichlet(y, 5, -1, 0), 'alpha must be'),
        (
            lambda y: P.partition_dirichlet(y, 10, 0.5, 0, min_samples=31),
            'min_samples=31',
        ),
        (
            lambda y: P.partition_dirichlet(
                y, 10, 0.01, 0, min_samples=29, max_tries=3
            ),
            r'max_tries=3.*min_samples=29.*alpha=0.01',
        ),
        (
            lambda y: P.partition_disjoint(y, 3, 7, 0),
            'classes_per_client=7 exceeds the 6 classes',
        ),
        (lambda y: P.partition_disjoint(y, 3, 0, 0), 'classes_per_client'),
        (
            lambda y: P.partition_shards(y, 100, 4, 0),
            '400 shards exceed the 300 samples',
        ),
        (
            lambda y: P.partition_shards(y, 2, 2, 0),
            '4 shards cannot cover the 6 classes',
        ),
        (lambda y: P.partition_shards(y, 2, 0, 0), 'shards_per_client'),
        (lambda y: P.partition_iid(y.astype(float), 2, 0), 'integer class'),
        (lambda y: P.partition_iid(y[:0], 2, 0), 'empty'),
    ],
)
def test_impossible_requests(call, match):
  with pytest.raises(ValueError, match=match):
    call(_balanced(6, 50))


def test_disjoint_class_too_small_for_holders():
  labels = np.array([0] * 10 + [1])
  with pytest.raises(ValueError, match='Class 1 has 1 samples but 2'):
    P.partition_disjoint(labels, 4, 1, seed=0)


class TestCapSamples:

  def test_caps_to_k_stratified(self):
    labels = _balanced(4, 100)
    parts = P.partition_disjoint(labels, 2, 2, seed=0)
    capped = P.cap_samples(parts, labels, 10, seed=0)
    for p, c in zip(parts, capped):
      assert len(c) == 10 and set(c) <= set(p)
      assert np.all(np.diff(c) > 0) and c.dtype == np.int64
      # Two equally sized classes keep 5 samples each.
      np.testing.assert_array_equal(
          np.bincount(labels[c])[np.unique(labels[p])], [5, 5]
      )

  def test_deterministic(self):
    labels = _imbalanced()
    parts = P.partition_iid(labels, 4, seed=0)
    a = P.cap_samples(parts, labels, 20, seed=1)
    b = P.cap_samples(parts, labels, 20, seed=1)
    c = P.cap_samples(parts, labels, 20, seed=2)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))

  def test_strict(self):
    labels = _balanced(2, 5)
    parts = [np.arange(3), np.arange(3, 10)]
    with pytest.raises(ValueError, match='client_000 has 3 samples.*k=5'):
      P.cap_samples(parts, labels, 5, seed=0)
    capped = P.cap_samples(parts, labels, 5, seed=0, strict=False)
    np.testing.assert_array_equal(capped[0], [0, 1, 2])
    assert len(capped[1]) == 5

  def test_bad_k(self):
    with pytest.raises(ValueError, match='k must be'):
      P.cap_samples([np.arange(3)], np.zeros(3, int), 0, seed=0)


class TestSplitClients:

  def test_partition_of_each_client(self):
    labels = _imbalanced()
    parts = P.partition_dirichlet(labels, 5, 0.5, seed=0)
    splits = P.split_clients(
        parts, labels, train=0.6, val=0.2, test=0.2, seed=0
    )
    for p, s in zip(parts, splits):
      joined = np.concatenate([s.train, s.val, s.test])
      np.testing.assert_array_equal(np.sort(joined), p)
      assert len(np.unique(joined)) == len(p)
      assert len(s.test) == max(1, int(np.floor(0.2 * len(p) + 0.5)))

  def test_stratified(self):
    labels = _balanced(2, 100)
    splits = P.split_clients(
        [np.arange(200)], labels, train=0.75, test=0.25, seed=0
    )
    np.testing.assert_array_equal(np.bincount(labels[splits[0].test]), [25, 25])
    np.testing.assert_array_equal(
        np.bincount(labels[splits[0].train]), [75, 75]
    )

  def test_unstratified_is_still_a_partition(self):
    labels = _balanced(3, 10)
    (s,) = P.split_clients([np.arange(30)], labels, seed=0, stratify=False)
    assert len(s.train) + len(s.test) == 30 and len(s.val) == 0

  def test_too_small_client(self):
    labels = _balanced(2, 10)
    with pytest.raises(ValueError, match='client_001 has 2 samples'):
      P.split_clients(
          [np.arange(10), np.arange(10, 12)],
          labels,
          train=0.5,
          val=0.25,
          test=0.25,
          seed=0,
      )

  @pytest.mark.parametrize(
      'fractions, match',
      [
          ((0.5, 0.0, 0.4), 'must be 1'),
          ((0.0, 0.5, 0.5), 'train fraction must be > 0'),
          ((1.2, 0.0, -0.2), 'must be in'),
      ],
  )
  def test_bad_fractions(self, fractions, match):
    train, val, test = fractions
    with pytest.raises(ValueError, match=match):
      P.split_clients(
          [np.arange(10)],
          np.zeros(10, int),
          train=train,
          val=val,
          test=test,
          seed=0,
      )


def _make(method='dirichlet', seed=0, **kwargs):
  params = dict(
      iid={},
      dirichlet=dict(alpha=0.5),
      disjoint=dict(classes_per_client=2),
      shards=dict(shards_per_client=2),
  )[method]
  params.update(kwargs)
  params.setdefault('num_clients', 5)
  return P.make_partition(
      LABEL_SETS['imbalanced'], method=method, seed=seed, **params
  )


class TestMakePartition:

  @pytest.mark.parametrize('method', P.METHODS)
  def test_every_sample_in_one_place(self, method):
    p = _make(method, val=0.1, test=0.2, train=0.7)
    parts = [np.concatenate([c.train, c.val, c.test]) for c in p.clients]
    _assert_disjoint(
        [np.sort(x) for x in parts], p.num_samples,
        complete=method != 'disjoint',
    )
    assert p.client_ids == [f'client_{i:03d}' for i in range(5)]
    assert p.num_classes == 10 and p.num_samples == 600
    assert p.params['num_clients'] == 5 and p.method == method

  @pytest.mark.parametrize('method', P.METHODS)
  def test_clients_match_scheme_function(self, method):
    p = _make(method, seed=4)
    union = [np.sort(np.concatenate([c.train, c.test])) for c in p.clients]
    labels = LABEL_SETS['imbalanced']
    expected = {
        'iid': lambda: P.partition_iid(labels, 5, 4),
        'dirichlet': lambda: P.partition_dirichlet(labels, 5, 0.5, 4),
        'disjoint': lambda: P.partition_disjoint(labels, 5, 2, 4),
        'shards': lambda: P.partition_shards(labels, 5, 2, 4),
    }[method]()
    assert all(np.array_equal(a, b) for a, b in zip(union, expected))

  def test_seed_reproducible(self):
    assert _make(seed=3) == _make(seed=3)
    assert _make(seed=3) != _make(seed=4)

  def test_cap_keeps_test_split(self):
    full = _make('disjoint', seed=1)
    capped = _make('disjoint', seed=1, max_train_samples=5)
    for f, c in zip(full.clients, capped.clients):
      assert len(c.train) == 5 and set(c.train) <= set(f.train)
      np.testing.assert_array_equal(f.test, c.test)
    assert capped.params['max_train_samples'] == 5
    assert capped.num_assigned() == full.num_assigned() - (
        sum(len(c.train) for c in full.clients) - 25
    )

  def test_counts(self):
    p = _make('disjoint')
    counts = p.counts('train')
    assert counts.shape == (5, 10) and counts.dtype == np.int64
    assert ((counts > 0).sum(axis=1) == 2).all()
    assert counts.sum() + p.counts('test').sum() == p.num_assigned()

  def test_summary(self):
    text = _make('shards').summary()
    assert "Partition 'shards'" in text and 'shards_per_client=2' in text
    assert 'client_004' in text and 'total' in text

  @pytest.mark.parametrize(
      'kwargs, match',
      [
          (dict(method='kmeans'), "Unknown method 'kmeans'"),
          (dict(method='dirichlet'), r"needs \['alpha'\]"),
          (dict(method='iid', alpha=0.1), r"Unknown option\(s\) \['alpha'\]"),
          (dict(method='iid', num_clients=0), 'num_clients must be'),
          (
              dict(method='disjoint', classes_per_client=11),
              'classes_per_client=11 exceeds',
          ),
          (dict(method='dirichlet', alpha=0), 'alpha must be'),
          (
              dict(method='iid', max_train_samples=500),
              'max_train_samples=500, but client_000 has only',
          ),
          (dict(method='iid', num_classes=5), 'num_classes=5 but labels'),
          (dict(method='iid', seed=None), 'seed must be'),
          (dict(method='iid', train=0.5), 'must be 1'),
      ],
  )
  def test_errors(self, kwargs, match):
    kwargs.setdefault('seed', 0)
    kwargs.setdefault('num_clients', 5)
    with pytest.raises(ValueError, match=match):
      P.make_partition(LABEL_SETS['imbalanced'], **kwargs)

  def test_client_left_empty(self):
    with pytest.raises(ValueError, match='num_clients=4 exceeds the 3'):
      P.make_partition(np.array([0, 0, 1]), num_clients=4, method='iid',
                       seed=0)


class TestSerialization:

  @pytest.mark.parametrize('method', P.METHODS)
  def test_save_load_round_trip(self, tmp_path, method):
    p = _make(method, val=0.1, train=0.65, test=0.25, max_train_samples=8)
    path = tmp_path / 'sub' / 'partition.json'
    p.save(path)
    assert not list(path.parent.glob('*.tmp'))
    q = P.Partition.load(path)
    assert q == p
    for a, b in zip(p.clients, q.clients):
      for split in P.SPLITS:
        x, y = a.get(split), b.get(split)
        assert np.array_equal(x, y) and y.dtype == np.int64
    for field in ('method', 'params', 'seed', 'num_samples', 'num_classes',
                  'client_ids'):
      assert getattr(p, field) == getattr(q, field)
    np.testing.assert_array_equal(p.labels, q.labels)
    # Saving again gives the same bytes.
    path2 = tmp_path / 'again.json'
    q.save(path2)
    assert path.read_bytes() == path2.read_bytes()

  def test_json_layout(self):
    p = _make('disjoint')
    data = json.loads(p.to_json())
    assert data['method'] == 'disjoint' and data['seed'] == 0
    assert data['params']['classes_per_client'] == 2
    assert data['class_counts']['client_000']['train'] == (
        p.counts('train')[0].tolist()
    )
    assert data['clients']['client_003']['test'] == (
        p.clients[3].test.tolist()
    )
    assert P.Partition.from_json(p.to_json()) == p

  def _tampered(self, edit):
    data = json.loads(_make('iid').to_json())
    edit(data)
    return json.dumps(data)

  @pytest.mark.parametrize(
      'edit, match',
      [
          (
              lambda d: d['clients']['client_001']['train'].append(10**6),
              'client_001 train index 1000000 is out of range',
          ),
          (
              lambda d: d['clients']['client_002']['test'].append(
                  d['clients']['client_000']['train'][0]
              ),
              'is in two places: client_000 train and client_002 test',
          ),
          (
              lambda d: d['class_counts']['client_000']['train'].__setitem__(
                  0, 999
              ),
              'class_counts of client_000 train disagree',
          ),
          (lambda d: d.pop('clients'), 'Malformed'),
          (
              lambda d: d['class_counts'].pop('client_001'),
              'class_counts of client_001 train missing or not a list',
          ),
          (
              lambda d: d['class_counts']['client_000'].update(test=None),
              'class_counts of client_000 test missing or not a list',
          ),
          (
              lambda d: d['clients']['client_000']['train'].__setitem__(
                  0, 1.5
              ),
              'client_000 train indices must be integers, got dtype float64',
          ),
          (
              lambda d: d.update(labels=[float(v) for v in d['labels']]),
              'labels must be integers',
          ),
          (lambda d: d.update(format='other'), 'Not a tff_pfl.partition'),
          (lambda d: d.update(version=99), 'version 99'),
          (
              lambda d: d['client_ids'].append('client_999'),
              'keys differ',
          ),
      ],
  )
  def test_load_rejects_invalid(self, tmp_path, edit, match):
    path = tmp_path / 'bad.json'
    path.write_text(self._tampered(edit))
    with pytest.raises(ValueError, match=match):
      P.Partition.load(path)

  def test_load_not_json(self, tmp_path):
    path = tmp_path / 'bad.json'
    path.write_text('{')
    with pytest.raises(ValueError, match='not valid JSON'):
      P.Partition.load(path)

  def test_load_missing(self, tmp_path):
    with pytest.raises(FileNotFoundError, match='nope.json'):
      P.Partition.load(tmp_path / 'nope.json')

  def test_constructor_validates(self):
    split = P.ClientSplit(train=[0, 1], val=[], test=[1])
    with pytest.raises(ValueError, match='Sample 1 is in two places'):
      P.Partition('manual', {}, 0, 3, 2, ['a'], [split])
    with pytest.raises(ValueError, match='2 client ids but 1 clients'):
      P.Partition('manual', {}, 0, 3, 2, ['a', 'b'], [split])


def test_bin_targets():
  y = np.linspace(0, 1, 100)
  bins = P.bin_targets(y, 4)
  assert bins.dtype == np.int64
  np.testing.assert_array_equal(np.bincount(bins), [25, 25, 25, 25])
  p = P.make_partition(bins, num_clients=4, method='dirichlet', alpha=1.0,
                       seed=0, min_samples=5)
  assert p.num_classes == 4
