"""Evaluation statistics of a model on one client's dataset (TensorFlow).

Returns sufficient statistics rather than finished metrics, so that the
server-side code (`tff_pfl.core.metrics`) can compute per-client accuracy and
macro-F1, MAE and RMSE, and summaries over clients, from one pass:

* classification: `confusion` (int64 `[K, K]`, rows true class), `loss_sum`,
  `num_examples`;
* regression: `abs_error_sum`, `sq_error_sum`, `loss_sum`, `num_examples`.
"""

import collections
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tff_pfl.core import model_spec as model_spec_lib


def evaluate_model(spec: model_spec_lib.ModelSpec, model: Callable[..., Any],
                   dataset: tf.data.Dataset) -> collections.OrderedDict:
  """Runs `model(x, training=False)` over `dataset`; returns statistics.

  `model` is a Keras model or any callable with that signature (e.g. a
  personalized model fusing two encoders).
  """
  k = spec.num_outputs
  if spec.task == 'classification':
    init = collections.OrderedDict(
        confusion=tf.zeros([k, k], tf.int64),
        loss_sum=tf.constant(0.0), num_examples=tf.constant(0.0))
  else:
    init = collections.OrderedDict(
        abs_error_sum=tf.constant(0.0), sq_error_sum=tf.constant(0.0),
        loss_sum=tf.constant(0.0), num_examples=tf.constant(0.0))

  def step(acc, batch):
    outputs = model(batch['x'], training=False)
    n = tf.cast(tf.shape(batch['y'])[0], tf.float32)
    out = collections.OrderedDict(acc)
    out['loss_sum'] = acc['loss_sum'] + spec.loss(batch['y'], outputs) * n
    out['num_examples'] = acc['num_examples'] + n
    if spec.task == 'classification':
      preds = tf.argmax(outputs, axis=-1, output_type=tf.int64)
      labels = tf.cast(tf.reshape(batch['y'], [-1]), tf.int64)
      out['confusion'] = acc['confusion'] + tf.math.confusion_matrix(
          labels, preds, num_classes=k, dtype=tf.int64)
    else:
      y = tf.reshape(tf.cast(batch['y'], outputs.dtype), tf.shape(outputs))
      err = outputs - y
      out['abs_error_sum'] = acc['abs_error_sum'] + tf.reduce_sum(
          tf.reduce_mean(tf.abs(err), axis=-1))
      out['sq_error_sum'] = acc['sq_error_sum'] + tf.reduce_sum(
          tf.reduce_mean(tf.square(err), axis=-1))
    return out

  return dataset.reduce(init, step)
