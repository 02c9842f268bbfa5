"""TFF `ClientData` from arrays and a `Partition`, plus batching/augmentation.

`build_client_data` exposes one split of a `Partition` as a
`tff.simulation.datasets.ClientData` whose elements are unbatched
`OrderedDict(x=float32 features, y=int64 or float32 label)`.

`make_batched_dataset` turns such a dataset into the batched, optionally
shuffled and augmented stream a client trains on. Its randomness is fully
determined by `shuffle_seed`: augmentation uses stateless random ops with a
per-element seed derived from it. That matters in TFF, where a dataset
built inside a serialised computation replays its op-level seeds every
round; the caller passes a different seed per round and client instead.
"""

import collections
from collections.abc import Callable, Sequence
from typing import Optional, Union

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_pfl.data import partition as partition_lib

Element = collections.OrderedDict
# An augmentation takes an unbatched element and a stateless seed (an int64
# tensor of shape [2]) and returns the transformed element.
AugmentFn = Callable[[Element, tf.Tensor], Element]


class ArrayClientData(tff.simulation.datasets.ClientData):
  """In-memory `ClientData` over shared arrays and per-client indices.

  `create_tf_dataset_for_client` slices the NumPy arrays of one client only,
  `create_pooled_dataset` the rows of all clients together.
  `serializable_dataset_fn` (used e.g. by `dataset_computation` or
  `create_tf_dataset_from_all_clients`) has to embed the whole arrays in a
  graph and is built lazily on first use; it is meant for small data sets
  (for CIFAR-10 it holds ~740 MB of constants).
  """

  def __init__(
      self,
      x: np.ndarray,
      y: np.ndarray,
      client_indices: dict[str, np.ndarray],
  ):
    if not client_indices:
      raise ValueError('ArrayClientData needs at least one client.')
    self._x = x
    self._y = y
    self._client_ids = list(client_indices)
    self._indices = {
        cid: np.asarray(idx, dtype=np.int64)
        for cid, idx in client_indices.items()
    }
    self._element_type_structure = collections.OrderedDict(
        x=tf.TensorSpec(shape=x.shape[1:], dtype=tf.float32),
        y=tf.TensorSpec(shape=(), dtype=tf.dtypes.as_dtype(y.dtype)),
    )
    self._serializable_fn = None

  @property
  def client_ids(self) -> list[str]:
    return list(self._client_ids)

  @property
  def element_type_structure(self):
    return self._element_type_structure

  def num_examples(self, client_id: str) -> int:
    """The number of examples of `client_id`."""
    return len(self._client_indices(client_id))

  def _client_indices(self, client_id: str) -> np.ndarray:
    if client_id not in self._indices:
      raise ValueError(
          f'Unknown client id {client_id!r}; this ClientData has '
          f'{len(self._client_ids)} clients ({self._client_ids[0]!r}, ...).'
      )
    return self._indices[client_id]

  def create_tf_dataset_for_client(self, client_id: str) -> tf.data.Dataset:
    idx = self._client_indices(client_id)
    return tf.data.Dataset.from_tensor_slices(
        collections.OrderedDict(x=self._x[idx], y=self._y[idx])
    )

  def create_pooled_dataset(self) -> tf.data.Dataset:
    """Every client's examples in one dataset, client after client."""
    idx = np.concatenate([self._indices[c] for c in self._client_ids])
    return tf.data.Dataset.from_tensor_slices(
        collections.OrderedDict(x=self._x[idx], y=self._y[idx])
    )

  @property
  def serializable_dataset_fn(self):
    if self._serializable_fn is None:
      self._serializable_fn = self._make_serializable_fn()
    return self._serializable_fn

  def _make_serializable_fn(self):
    ids = list(self._client_ids)
    rows = [self._indices[cid] for cid in ids]
    flat = np.concatenate(rows) if rows else np.zeros(0, np.int64)
    lengths = np.array([len(r) for r in rows], dtype=np.int64)
    x, y = self._x, self._y

    @tf.function
    def dataset_fn(client_id):
      position = tf.where(tf.equal(tf.constant(ids), client_id))
      tf.debugging.assert_equal(
          tf.size(position),
          tf.constant(1, tf.int32),
          message='Unknown client id',
      )
      table = tf.RaggedTensor.from_row_lengths(
          tf.constant(flat), tf.constant(lengths)
      )
      indices = table[tf.cast(position[0][0], tf.int64)]
      x_all = tf.constant(x)
      y_all = tf.constant(y)
      return tf.data.Dataset.from_tensor_slices(indices).map(
          lambda i: collections.OrderedDict(
              x=tf.gather(x_all, i), y=tf.gather(y_all, i)
          )
      )

    return dataset_fn


def build_client_data(
    x: np.ndarray,
    y: np.ndarray,
    partition: partition_lib.Partition,
    split: str,
    *,
    allow_empty: bool = False,
) -> ArrayClientData:
  """Builds the `ClientData` of one split of `partition`.

  Client ids are the partition's ids in order; element i of a client is
  `OrderedDict(x=x[j], y=y[j])` for its j-th index (ascending).

  A `ClientData` is expected to hold data for every client id, so by
  default a client whose split is empty is an error. With `allow_empty`
  such clients are kept with an empty dataset (their ids still line up with
  the partition); a split that is empty for every client is always an
  error.

  Args:
    x: Pooled features, shape [num_samples, ...]; cast to float32.
    y: Pooled labels (int, cast to int64) or regression targets (float,
      cast to float32), shape [num_samples].
    partition: The partition; its indices refer to rows of `x` and `y`.
    split: 'train', 'val' or 'test'.
    allow_empty: Keep clients whose split is empty.

  Returns:
    An `ArrayClientData` (a `tff.simulation.datasets.ClientData`).

  Raises:
    ValueError: If the arrays do not match the partition (length or, for
      classification, labels), `split` is unknown, or clients are empty.
  """
  if split not in partition_lib.SPLITS:
    raise ValueError(
        f'split must be one of {partition_lib.SPLITS}, got {split!r}.'
    )
  x = np.asarray(x)
  y = np.asarray(y)
  if len(x) != partition.num_samples or len(y) != partition.num_samples:
    raise ValueError(
        f'The partition covers {partition.num_samples} samples but x has '
        f'{len(x)} and y has {len(y)} rows.'
    )
  if np.issubdtype(y.dtype, np.integer):
    y = y.astype(np.int64, copy=False)
    if partition.labels is not None and not np.array_equal(
        y, partition.labels
    ):
      raise ValueError(
          'y differs from the labels the partition was made from: wrong data '
          'set or different sample order?'
      )
  elif np.issubdtype(y.dtype, np.floating):
    y = y.astype(np.float32, copy=False)
  else:
    raise ValueError(f'y must be integer or float, got dtype {y.dtype}.')
  if not np.issubdtype(x.dtype, np.floating):
    raise ValueError(
        f'x must be floating point (float32 in [0, 1] for images), got '
        f'{x.dtype}.'
    )
  x = x.astype(np.float32, copy=False)
  indices = dict(zip(partition.client_ids, partition.indices(split)))
  empty = [cid for cid, idx in indices.items() if len(idx) == 0]
  if len(empty) == len(indices):
    raise ValueError(f'Split {split!r} is empty for every client.')
  if empty and not allow_empty:
    raise ValueError(
        f'Split {split!r} is empty for client(s) {empty}; pass '
        'allow_empty=True to keep them with empty datasets.'
    )
  return ArrayClientData(x, y, indices)


def with_index(dataset: tf.data.Dataset) -> tf.data.Dataset:
  """Adds `index`, each element's int64 position in the client's split.

  Methods that keep per-sample client state (FedPSD's stored predictions)
  look samples up by this position, which survives shuffling and
  augmentation; apply it before `make_batched_dataset`.
  """
  def add(position, element):
    out = collections.OrderedDict(element)
    out['index'] = position
    return out
  return dataset.enumerate().map(add)


def _as_seed_tensor(seed: Union[int, tf.Tensor]) -> tf.Tensor:
  return tf.cast(tf.convert_to_tensor(seed), tf.int64)


def compose(*fns: AugmentFn) -> AugmentFn:
  """Chains augmentations, giving each its own seed split off the input."""

  def composed(element: Element, seed: tf.Tensor) -> Element:
    seeds = tf.random.experimental.stateless_split(seed, num=max(len(fns), 1))
    for i, fn in enumerate(fns):
      element = fn(element, seeds[i])
    return element

  return composed


def random_crop_flip(padding: int = 4) -> AugmentFn:
  """Zero-pads the image, crops it back at random and maybe flips it.

  The standard CIFAR augmentation. Works on unbatched HWC images; the crop
  offset and the horizontal flip come from stateless ops, so the same seed
  gives the same result.

  Args:
    padding: Pixels of zero padding on each side, >= 0.

  Returns:
    An augmentation `(element, seed) -> element`.

  Raises:
    ValueError: If `padding` < 0.
  """
  if padding < 0:
    raise ValueError(f'padding must be >= 0, got {padding}.')

  def augment(element: Element, seed: tf.Tensor) -> Element:
    crop_seed, flip_seed = tf.unstack(
        tf.random.experimental.stateless_split(seed, num=2)
    )
    image = element['x']
    shape = tf.shape(image)
    if padding:
      image = tf.pad(image, [[padding, padding], [padding, padding], [0, 0]])
    image = tf.image.stateless_random_crop(image, shape, seed=crop_seed)
    image = tf.image.stateless_random_flip_left_right(image, seed=flip_seed)
    out = collections.OrderedDict(element)
    out['x'] = tf.ensure_shape(image, element['x'].shape)
    return out

  return augment


def normalize(
    mean: Union[float, Sequence[float]], std: Union[float, Sequence[float]]
) -> AugmentFn:
  """Returns an augmentation computing (x - mean) / std (seed ignored).

  Args:
    mean: Scalar or per-channel means.
    std: Scalar or per-channel standard deviations, all > 0.

  Raises:
    ValueError: If a std is not positive.
  """
  mean_array = np.asarray(mean, dtype=np.float32)
  std_array = np.asarray(std, dtype=np.float32)
  if (std_array <= 0).any():
    raise ValueError(f'std must be > 0, got {std!r}.')

  def augment(element: Element, seed: tf.Tensor) -> Element:
    del seed  # Deterministic.
    out = collections.OrderedDict(element)
    out['x'] = (element['x'] - mean_array) / std_array
    return out

  return augment


def make_batched_dataset(
    dataset: tf.data.Dataset,
    *,
    batch_size: int,
    shuffle_seed: Optional[Union[int, tf.Tensor]] = None,
    shuffle_buffer: Optional[int] = None,
    repeat: int = 1,
    augment: Union[None, AugmentFn, Sequence[AugmentFn]] = None,
    drop_remainder: bool = False,
) -> tf.data.Dataset:
  """Shuffles, repeats, augments and batches a client dataset.

  Order of operations: shuffle (reshuffled every epoch), repeat, augment,
  batch. Shuffling happens when `shuffle_seed` or `shuffle_buffer` is given;
  the buffer defaults to the dataset's size when statically known (a full
  shuffle) and to 10,000 otherwise (e.g. inside a TFF computation). Without
  `shuffle_seed` the shuffle is unseeded.

  Augmentations get a stateless seed per element: [shuffle_seed, position
  in the repeated stream] (shuffle_seed 0 when None). The same
  `shuffle_seed` therefore reproduces order and augmentation exactly, and
  each epoch of a repeat sees different augmentations.

  Args:
    dataset: Unbatched dataset of `OrderedDict(x=..., y=...)`.
    batch_size: Examples per batch, >= 1.
    shuffle_seed: Python int or int scalar tensor (e.g. derived from round
      number and client) that seeds shuffle and augmentation.
    shuffle_buffer: Shuffle buffer size.
    repeat: Number of epochs, >= 1, or -1 to repeat forever.
    augment: An augmentation `(element, seed) -> element` or a sequence of
      them (applied in order, each with its own seed).
    drop_remainder: Drop the last partial batch.

  Returns:
    The batched `tf.data.Dataset`.

  Raises:
    ValueError: If `batch_size`, `shuffle_buffer` or `repeat` is invalid.
  """
  if batch_size < 1:
    raise ValueError(f'batch_size must be >= 1, got {batch_size}.')
  if shuffle_buffer is not None and shuffle_buffer < 1:
    raise ValueError(f'shuffle_buffer must be >= 1, got {shuffle_buffer}.')
  if repeat != -1 and repeat < 1:
    raise ValueError(f'repeat must be >= 1 or -1, got {repeat}.')
  if shuffle_seed is not None or shuffle_buffer is not None:
    if shuffle_buffer is None:
      size = tf.get_static_value(dataset.cardinality())
      shuffle_buffer = int(size) if size is not None and size > 0 else 10_000
    seed = None if shuffle_seed is None else _as_seed_tensor(shuffle_seed)
    dataset = dataset.shuffle(
        shuffle_buffer, seed=seed, reshuffle_each_iteration=True
    )
  if repeat != 1:
    dataset = dataset.repeat(None if repeat == -1 else repeat)
  if augment is not None:
    fn = compose(*augment) if isinstance(augment, Sequence) else augment
    base = _as_seed_tensor(0 if shuffle_seed is None else shuffle_seed)

    def apply(position, element):
      return fn(element, tf.stack([base, position]))

    dataset = dataset.enumerate().map(
        apply, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
    )
  return dataset.batch(batch_size, drop_remainder=drop_remainder)
