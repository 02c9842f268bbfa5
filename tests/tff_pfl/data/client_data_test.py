"""Tests for tff_pfl.data.client_data.

These tests never execute a TFF computation: in TFF 0.87 doing so starts a
`worker_binary` process that outlives the test run.
"""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_pfl.data import client_data as C
from tff_pfl.data import partition as P


def _data(n=60, num_classes=3, shape=(4, 4, 1)):
  rng = np.random.default_rng(0)
  x = rng.random((n,) + shape).astype(np.float32)
  y = np.arange(n) % num_classes
  return x, y


def _partition(y, **kwargs):
  kwargs.setdefault('num_clients', 3)
  kwargs.setdefault('method', 'iid')
  return P.make_partition(y, seed=0, **kwargs)


def _elements(dataset):
  return list(dataset.as_numpy_iterator())


class TestBuildClientData:

  def test_ids_spec_and_content(self):
    x, y = _data()
    partition = _partition(y)
    cd = C.build_client_data(x, y, partition, 'train')
    assert isinstance(cd, tff.simulation.datasets.ClientData)
    assert cd.client_ids == ['client_000', 'client_001', 'client_002']
    expected_spec = collections.OrderedDict(
        x=tf.TensorSpec((4, 4, 1), tf.float32),
        y=tf.TensorSpec((), tf.int64),
    )
    assert cd.element_type_structure == expected_spec
    for cid, split in zip(cd.client_ids, partition.clients):
      ds = cd.create_tf_dataset_for_client(cid)
      assert ds.element_spec == expected_spec
      elements = _elements(ds)
      assert isinstance(elements[0], collections.OrderedDict)
      assert list(elements[0]) == ['x', 'y']
      np.testing.assert_array_equal(
          np.stack([e['x'] for e in elements]), x[split.train]
      )
      np.testing.assert_array_equal([e['y'] for e in elements], y[split.train])
      assert cd.num_examples(cid) == len(split.train)

  def test_serializable_dataset_fn_matches(self):
    x, y = _data()
    cd = C.build_client_data(x, y, _partition(y), 'test')
    fn = cd.serializable_dataset_fn
    for cid in cd.client_ids:
      eager = _elements(cd.create_tf_dataset_for_client(cid))
      traced = _elements(fn(tf.constant(cid)))
      assert len(eager) == len(traced)
      for a, b in zip(eager, traced):
        np.testing.assert_array_equal(a['x'], b['x'])
        assert a['y'] == b['y']
    everything = _elements(cd.create_tf_dataset_from_all_clients(seed=0))
    assert len(everything) == sum(cd.num_examples(c) for c in cd.client_ids)

  def test_pooled_dataset_is_every_clients_rows_once(self):
    x, y = _data()
    partition = _partition(y)
    cd = C.build_client_data(x, y, partition, 'test')
    pooled = _elements(cd.create_pooled_dataset())
    rows = np.concatenate([s.test for s in partition.clients])
    assert len(pooled) == len(rows) == len(set(rows.tolist()))
    np.testing.assert_array_equal(np.stack([e['x'] for e in pooled]), x[rows])
    np.testing.assert_array_equal([e['y'] for e in pooled], y[rows])
    assert cd.create_pooled_dataset().element_spec == cd.element_type_structure

  def test_regression_labels(self):
    x, _ = _data(shape=(5,))
    targets = np.linspace(0, 1, 60)
    partition = _partition(P.bin_targets(targets, 3))
    cd = C.build_client_data(x, targets, partition, 'train')
    assert cd.element_type_structure['y'] == tf.TensorSpec((), tf.float32)

  def test_empty_split(self):
    x, y = _data()
    partition = _partition(y)
    with pytest.raises(ValueError, match="'val' is empty for every client"):
      C.build_client_data(x, y, partition, 'val')
    partition.clients[1].test = np.zeros(0, np.int64)
    with pytest.raises(ValueError, match=r"client\(s\) \['client_001'\]"):
      C.build_client_data(x, y, partition, 'test')
    cd = C.build_client_data(x, y, partition, 'test', allow_empty=True)
    assert cd.client_ids == partition.client_ids
    assert not _elements(cd.create_tf_dataset_for_client('client_001'))

  def test_mismatched_arrays(self):
    x, y = _data()
    partition = _partition(y)
    with pytest.raises(ValueError, match='covers 60 samples but x has 59'):
      C.build_client_data(x[:59], y, partition, 'train')
    with pytest.raises(ValueError, match='differs from the labels'):
      C.build_client_data(x, (y + 1) % 3, partition, 'train')
    with pytest.raises(ValueError, match='must be floating point'):
      C.build_client_data((x * 255).astype(np.uint8), y, partition, 'train')
    with pytest.raises(ValueError, match='split must be one of'):
      C.build_client_data(x, y, partition, 'validation')

  def test_unknown_client(self):
    x, y = _data()
    cd = C.build_client_data(x, y, _partition(y), 'train')
    with pytest.raises(ValueError, match="Unknown client id 'client_9'"):
      cd.create_tf_dataset_for_client('client_9')


def _batches(**kwargs):
  x, y = _data(n=40)
  ds = tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=x, y=y))
  return _elements(C.make_batched_dataset(ds, **kwargs))


def _order(batches):
  return np.concatenate([b['y'] for b in batches]).tolist()


def _ids(n=40):
  return tf.data.Dataset.from_tensor_slices(
      collections.OrderedDict(
          x=np.zeros((n, 1), np.float32), y=np.arange(n, dtype=np.int64)
      )
  )


class TestMakeBatchedDataset:

  def test_no_shuffle_keeps_order(self):
    batches = _elements(C.make_batched_dataset(_ids(), batch_size=16))
    assert [len(b['y']) for b in batches] == [16, 16, 8]
    assert _order(batches) == list(range(40))

  def test_drop_remainder_and_repeat(self):
    ds = C.make_batched_dataset(
        _ids(), batch_size=16, repeat=2, drop_remainder=True
    )
    assert ds.element_spec['y'].shape == (16,)
    assert len(_elements(ds)) == 5

  def test_same_seed_same_order_other_seed_differs(self):
    def order(seed):
      ds = C.make_batched_dataset(_ids(), batch_size=8, shuffle_seed=seed)
      return _order(_elements(ds))

    assert order(7) == order(7)
    assert order(7) != order(8)
    assert sorted(order(7)) == list(range(40))

  def test_tensor_seed(self):
    a = C.make_batched_dataset(_ids(), batch_size=8, shuffle_seed=3)
    b = C.make_batched_dataset(
        _ids(), batch_size=8, shuffle_seed=tf.constant(3, tf.int64)
    )
    assert _order(_elements(a)) == _order(_elements(b))

  def test_repeat_reshuffles_each_epoch(self):
    ds = C.make_batched_dataset(_ids(), batch_size=40, shuffle_seed=1, repeat=2)
    first, second = (b['y'].tolist() for b in _elements(ds))
    assert sorted(first) == sorted(second) and first != second

  def test_augmentation_is_seeded(self):
    augment = [C.random_crop_flip(padding=2), C.normalize(0.5, 0.25)]
    a = _batches(batch_size=10, shuffle_seed=1, augment=augment)
    b = _batches(batch_size=10, shuffle_seed=1, augment=augment)
    c = _batches(batch_size=10, shuffle_seed=2, augment=augment)
    for u, v in zip(a, b):
      np.testing.assert_array_equal(u['x'], v['x'])
    assert a[0]['x'].shape == (10, 4, 4, 1)
    assert not all(np.array_equal(u['x'], v['x']) for u, v in zip(a, c))

  def test_augmentation_without_shuffle_keeps_order(self):
    batches = _batches(batch_size=40, augment=C.random_crop_flip(0))
    np.testing.assert_array_equal(batches[0]['y'], np.arange(40) % 3)

  def test_random_crop_flip_content(self):
    image = np.arange(16, dtype=np.float32).reshape(4, 4, 1)
    element = collections.OrderedDict(x=tf.constant(image), y=tf.constant(0))
    flipped = 0
    for i in range(20):
      out = C.random_crop_flip(padding=0)(
          element, tf.constant([i, 0], tf.int64)
      )['x'].numpy()
      assert out.shape == (4, 4, 1)
      if np.array_equal(out, image[:, ::-1]):
        flipped += 1
      else:
        np.testing.assert_array_equal(out, image)
    assert 0 < flipped < 20
    padded = C.random_crop_flip(padding=2)(
        element, tf.constant([1, 2], tf.int64)
    )['x'].numpy()
    assert padded.shape == (4, 4, 1)
    assert set(np.unique(padded)) <= set(range(16))

  def test_normalize(self):
    element = collections.OrderedDict(
        x=tf.ones((2, 2, 3)), y=tf.constant(1, tf.int64)
    )
    out = C.normalize([0.5, 0.0, 1.0], [0.5, 2.0, 1.0])(element, None)
    np.testing.assert_allclose(out['x'][0, 0], [1.0, 0.5, 0.0])
    assert out['y'] == 1
    with pytest.raises(ValueError, match='std must be > 0'):
      C.normalize(0.0, 0.0)

  @pytest.mark.parametrize(
      'kwargs, match',
      [
          (dict(batch_size=0), 'batch_size must be'),
          (dict(batch_size=2, shuffle_buffer=0), 'shuffle_buffer must be'),
          (dict(batch_size=2, repeat=0), 'repeat must be'),
      ],
  )
  def test_invalid(self, kwargs, match):
    with pytest.raises(ValueError, match=match):
      C.make_batched_dataset(_ids(), **kwargs)

  def test_padding_must_be_non_negative(self):
    with pytest.raises(ValueError, match='padding must be >= 0'):
      C.random_crop_flip(-1)


def test_with_index_survives_shuffle_and_augmentation():
  x = np.arange(10, dtype=np.float32).reshape(10, 1, 1, 1)
  base = tf.data.Dataset.from_tensor_slices(
      collections.OrderedDict(x=x, y=np.arange(10, dtype=np.int64)))
  ds = C.make_batched_dataset(
      C.with_index(base), batch_size=4, shuffle_seed=3,
      augment=C.normalize(0.0, 1.0))
  seen = []
  for batch in ds:
    np.testing.assert_array_equal(batch['index'], batch['y'])
    seen += list(batch['index'].numpy())
  assert sorted(seen) == list(range(10)) and seen != list(range(10))
