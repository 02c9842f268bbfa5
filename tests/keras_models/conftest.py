"""Shared fixtures for the keras_models tests."""

from collections.abc import Callable
import pathlib

import numpy as np
import pytest
import tensorflow as tf


def _sgd_step(
    model: tf.keras.Model,
    x: np.ndarray,
    y: np.ndarray,
    loss_fn: Callable[[tf.Tensor, tf.Tensor], tf.Tensor],
    learning_rate: float = 0.1,
) -> list[bool]:
  """Runs one plain SGD step; returns which trainable variables changed.

  Also asserts that every trainable variable received a gradient and that
  the loss is finite.
  """
  variables = model.trainable_variables
  assert variables, f'{model.name} has no trainable variables'
  before = [v.numpy().copy() for v in variables]
  with tf.GradientTape() as tape:
    loss = loss_fn(y, model(x, training=True))
  assert np.isfinite(loss.numpy())
  grads = tape.gradient(loss, variables)
  missing = [v.name for v, g in zip(variables, grads) if g is None]
  assert not missing, f'no gradient for {missing}'
  for v, g in zip(variables, grads):
    v.assign_sub(learning_rate * g)
  return [not np.array_equal(b, v.numpy()) for b, v in zip(before, variables)]


def pytest_collection_modifyitems(
    config: pytest.Config, items: list[pytest.Item]
) -> None:
  """Silences a Keras 2.14 warning triggered by seeding, in these tests only.

  With a global seed, Keras calls `random.randint(1, 1e9)`, which Python 3.11
  deprecates; the warning is about Keras internals, not this package.
  """
  del config
  here = pathlib.Path(__file__).parent
  for item in items:
    if here in item.path.parents:
      item.add_marker(
          pytest.mark.filterwarnings(
              'ignore:non-integer arguments to randrange'
          )
      )


@pytest.fixture(autouse=True)
def _seed() -> None:
  """Makes random initialization and inputs deterministic in every test."""
  tf.keras.utils.set_random_seed(0)


@pytest.fixture
def sgd_step() -> Callable[..., list[bool]]:
  """Returns a function running one SGD step, see `_sgd_step`."""
  return _sgd_step


@pytest.fixture
def classification_step(
    sgd_step: Callable[..., list[bool]],
) -> Callable[[tf.keras.Model, tuple[int, ...], int], list[bool]]:
  """Returns `f(model, input_shape, num_classes)`: one SGD step on logits."""

  def step(
      model: tf.keras.Model, input_shape: tuple[int, ...], num_classes: int
  ) -> list[bool]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, *input_shape)).astype(np.float32)
    y = np.array([0, num_classes - 1], dtype=np.int32)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return sgd_step(model, x, y, loss_fn)

  return step
