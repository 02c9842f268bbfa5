"""Tests for tff_pfl.templates.local_training (the one training loop)."""

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_pfl.templates import local_training

from tests.tff_pfl import conftest as helpers


def test_train_model_counts_examples_and_steps():
  spec = helpers.make_spec()
  model = spec.keras_model_fn()
  x, y = helpers.make_client_arrays(1, n=20)[0]
  dataset = helpers.to_dataset(x, y, batch_size=8)      # batches 8, 8, 4
  before = [v.numpy().copy() for v in model.trainable_variables]
  sums = tf.function(lambda: local_training.train_model(
      spec, model, tff.learning.optimizers.build_sgdm(0.1), dataset, 2))()
  assert float(sums['num_examples']) == 40.0
  assert float(sums['num_steps']) == 6.0
  assert float(sums['extra_sum']) == 0.0
  assert np.isfinite(float(sums['loss_sum']))
  assert any(not np.allclose(a, b.numpy())
             for a, b in zip(before, model.trainable_variables))
