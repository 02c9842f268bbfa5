"""Small models and client datasets shared by the tff_pfl tests."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_pfl.core import model_spec
from tff_pfl.core import runtime

NUM_FEATURES = 4
NUM_CLASSES = 3


def make_spec(batch_norm: bool = False) -> model_spec.ModelSpec:
  def keras_model_fn():
    layers = [tf.keras.layers.InputLayer((NUM_FEATURES,)),
              tf.keras.layers.Dense(8, activation='relu')]
    if batch_norm:
      layers.append(tf.keras.layers.BatchNormalization())
    layers.append(tf.keras.layers.Dense(NUM_CLASSES))
    return tf.keras.Sequential(layers)
  return model_spec.ModelSpec(
      keras_model_fn,
      collections.OrderedDict(
          x=tf.TensorSpec([None, NUM_FEATURES], tf.float32),
          y=tf.TensorSpec([None], tf.int64)),
      'classification', NUM_CLASSES)


def make_batch_norm_encoder_head_spec(
    input_spec: collections.OrderedDict) -> model_spec.ModelSpec:
  """A small 'encoder' + 'head' model whose encoder ends in BatchNorm (for
  methods that keep BatchNorm statistics on the client)."""
  def keras_model_fn():
    features = tf.keras.Input((NUM_FEATURES,))
    hidden = tf.keras.layers.Dense(8, activation='relu')(features)
    encoder = tf.keras.Model(
        features, tf.keras.layers.BatchNormalization()(hidden),
        name='encoder')
    head = tf.keras.Sequential(
        [tf.keras.Input((8,)), tf.keras.layers.Dense(NUM_CLASSES)],
        name='head')
    inputs = tf.keras.Input((NUM_FEATURES,))
    return tf.keras.Model(inputs, head(encoder(inputs)))
  return model_spec.ModelSpec(keras_model_fn, input_spec, 'classification',
                              NUM_CLASSES)


def make_client_arrays(num_clients: int, n: int = 24, seed: int = 0):
  """Non-IID toy data: client i's features are shifted by i."""
  rng = np.random.default_rng(seed)
  out = []
  for i in range(num_clients):
    x = (rng.normal(size=(n, NUM_FEATURES)) + i).astype(np.float32)
    y = ((x[:, 0] > i).astype(np.int64) + (i % 2)) % NUM_CLASSES
    out.append((x, y))
  return out


def to_dataset(x, y, batch_size=8):
  return tf.data.Dataset.from_tensor_slices(
      collections.OrderedDict(x=x, y=y)).batch(batch_size)


@pytest.fixture(scope='session', autouse=True)
def tff_context():
  runtime.ensure_context()
  yield
  runtime.shutdown()


def eager_sgd(spec, weights, dataset, *, epochs, lr, num_last=None):
  """Reference: plain eager mini-batch SGD from `weights`.

  Trains all trainable variables, or only the last `num_last` of them.
  Returns the trained Keras model.
  """
  from tff_pfl.core import model_spec as model_spec_lib  # pylint: disable=g-import-not-at-top
  model = spec.keras_model_fn()
  model_spec_lib.assign_weights(model, weights)
  variables = model.trainable_variables
  if num_last is not None:
    variables = variables[-num_last:]
  for _ in range(epochs):
    for batch in dataset:
      with tf.GradientTape() as tape:
        loss = spec.loss(batch['y'], model(batch['x'], training=True))
      for v, g in zip(variables, tape.gradient(loss, variables)):
        v.assign_sub(lr * g)
  return model


def round_then_shift_statistics(process, datasets, shift=3.0):
  """One round from initial client states; returns `(server state, the
  same state with every global non-trainable weight (BatchNorm moving
  statistics) moved by `shift`, the clients' states)`: for tests that the
  clients' own statistics, not the server's, reach a client's model."""
  state = process.initialize()
  states = [process.initial_client_state(str(i))
            for i in range(len(datasets))]
  state, states, _ = process.next(state, states, datasets)
  shifted = state._replace(
      global_model_weights=tff.learning.models.ModelWeights(
          trainable=state.global_model_weights.trainable,
          non_trainable=[np.asarray(t) + shift for t in
                         state.global_model_weights.non_trainable]))
  return state, shifted, states


def eager_fedavg_round(spec, weights, datasets, *, epochs, lr):
  """Reference: one FedAvg round written out eagerly for equal-sized
  clients, whose new global model is the plain mean of their `eager_sgd`
  results. Returns `ModelWeights` (trainable only)."""
  trained = [eager_sgd(spec, weights, d, epochs=epochs, lr=lr)
             for d in datasets]
  return tff.learning.models.ModelWeights(
      trainable=[np.mean([m.trainable_variables[j].numpy() for m in trained],
                         axis=0)
                 for j in range(len(trained[0].trainable_variables))],
      non_trainable=[])
