"""Tests for tff_pfl.algorithms.registry: every name builds, typos fail."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

import keras_models

from tff_pfl.algorithms import registry
from tff_pfl.core import model_spec
from tff_pfl.data import client_data

from tests.tff_pfl import conftest as helpers

# A keras_models.build_model spec ('encoder' + 'head'), which every
# algorithm accepts (AFedCL requires it); datasets carry `index` (FedPSD
# needs it; the others ignore it).
SPEC = model_spec.ModelSpec(
    lambda: keras_models.build_model('mlp', (helpers.NUM_FEATURES,),
                                     helpers.NUM_CLASSES,
                                     encoder_options={'hidden': (8,)}),
    dict(helpers.make_spec().input_spec,
         index=tf.TensorSpec([None], tf.int64)),
    'classification', helpers.NUM_CLASSES)


@pytest.mark.parametrize('name', sorted(registry.ALGORITHMS))
def test_every_algorithm_builds_with_the_common_arguments(name):
  process = registry.build(
      name, SPEC, initial_weights=SPEC.initial_weights(seed=0),
      client_optimizer=tff.learning.optimizers.build_sgdm(0.1),
      server_optimizer=tff.learning.optimizers.build_sgdm(1.0),
      local_epochs=1, learning_rate_decay=1.0,
      run_context=dict(num_clients=3, total_rounds=5))
  assert process.name == name
  # FedPSD's Eq. 10 needs each method's model after local training;
  # AFedCL's clients train a fused model that is not one spec model.
  assert process.has_local_models == (name != 'afedcl')
  assert (registry.ALGORITHMS[name].reports_local_models
          == process.has_local_models)


def test_unknown_hyperparameter_and_unknown_name_are_refused():
  w0 = SPEC.initial_weights(seed=0)
  with pytest.raises(ValueError, match="does not take \\['mu'\\]"):
    registry.build('ditto', SPEC, initial_weights=w0, mu=1.0,
                   client_optimizer=tff.learning.optimizers.build_sgdm(0.1))
  with pytest.raises(ValueError, match='fedavgg'):
    registry.build('fedavgg', SPEC, initial_weights=w0,
                   client_optimizer=tff.learning.optimizers.build_sgdm(0.1))


def _indexed_dataset(x, y):
  base = tf.data.Dataset.from_tensor_slices(
      collections.OrderedDict(x=x, y=y))
  return client_data.with_index(base).batch(8)


def _leaves(structure):
  return [np.asarray(t) for t in tf.nest.flatten(structure)]


def _batch_norm_spec():
  """SPEC's model with a BatchNorm layer ending its encoder."""
  return helpers.make_batch_norm_encoder_head_spec(SPEC.input_spec)


@pytest.mark.parametrize(
    'name, kwargs',
    [(name, {}) for name in sorted(registry.ALGORITHMS)] +
    [(name, {'local_statistics': True})
     for name in ('afedcl', 'fedper', 'fedrep')])
def test_a_diverged_participation_leaves_the_client_state_untouched(
    name, kwargs):
  # A client whose first participation diverges (non-finite features) must
  # come back as it went in: its update is dropped and nothing it computed
  # may be kept, not even the participation count, because methods read
  # `num_participations > 0` as "has its own trained state" (MOON's
  # previous model, FedPSD's stored predictions and personal model,
  # the own BatchNorm statistics of `local_statistics`). Its next, finite
  # participation is then a first one and must train normally.
  spec = _batch_norm_spec() if kwargs else SPEC
  process = registry.build(
      name, spec, initial_weights=spec.initial_weights(seed=0),
      client_optimizer=tff.learning.optimizers.build_sgdm(0.1),
      server_optimizer=tff.learning.optimizers.build_sgdm(1.0),
      local_epochs=1, learning_rate_decay=1.0,
      run_context=dict(num_clients=2, total_rounds=4), **kwargs)
  (x0, y0), (x1, y1) = helpers.make_client_arrays(2)
  good = [_indexed_dataset(x0, y0), _indexed_dataset(x1, y1)]
  bad = _indexed_dataset(np.full_like(x1, 1e30), y1)
  initial = [process.initial_client_state(str(i)) for i in range(2)]

  state = process.initialize()
  state, states, metrics = process.next(state, initial, [good[0], bad])
  assert metrics['client_work']['non_finite'] == 1.0
  for got, want in zip(_leaves(states[1]), _leaves(initial[1])):
    np.testing.assert_array_equal(got, want)
  assert int(states[0].num_participations) == 1
  assert int(states[1].num_participations) == 0

  state, states, metrics = process.next(state, states, good)
  assert metrics['client_work']['non_finite'] == 0.0
  assert int(states[1].num_participations) == 1
  assert all(np.all(np.isfinite(t)) for t in _leaves(states))
