"""Eager reference computations for the distillation/contrastive baselines.

Plain eager mini-batch SGD (no TFF) on CE plus an extra term, and FedAvg's
example-weighted mean, against which the MOON, FedNTD and FedLMD processes
are checked.
"""

import numpy as np
import tensorflow as tf

from tff_pfl.core import model_spec


def local_sgd(spec, weights, dataset, *, epochs, lr, forward_fn=None):
  """Eager SGD from `weights` on CE + extra.

  Args:
    spec: model spec.
    weights: starting `ModelWeights`.
    dataset: batched client dataset (iterated in order).
    epochs: local epochs.
    lr: SGD learning rate.
    forward_fn: optional `(model, batch) -> (logits, extra)`; default
      `(model(x), 0)`.

  Returns:
    `(trainable weights as NumPy arrays, mean extra per example)`.
  """
  model = spec.keras_model_fn()
  model_spec.assign_weights(model, weights)
  extra_sum, n = 0.0, 0.0
  for _ in range(epochs):
    for batch in dataset:
      with tf.GradientTape() as tape:
        if forward_fn is None:
          logits, extra = model(batch['x'], training=True), 0.0
        else:
          logits, extra = forward_fn(model, batch)
        loss = spec.loss(batch['y'], logits) + extra
      variables = model.trainable_variables
      for v, g in zip(variables, tape.gradient(loss, variables)):
        v.assign_sub(lr * g)
      size = float(batch['y'].shape[0])
      extra_sum += float(extra) * size
      n += size
  return [v.numpy() for v in model.trainable_variables], extra_sum / n


def weighted_mean(client_weights, counts):
  """FedAvg's aggregate: the example-weighted mean of clients' weights."""
  counts = np.asarray(counts, np.float64)
  return [sum(c * np.asarray(w[i], np.float64)
              for c, w in zip(counts, client_weights)) / counts.sum()
          for i in range(len(client_weights[0]))]


def num_examples(dataset):
  return sum(int(b['y'].shape[0]) for b in dataset)


def assert_weights_close(got, want, atol=1e-6):
  assert len(got) == len(want)
  for x, y in zip(got, want):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=atol)
