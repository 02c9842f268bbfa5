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


def _assert_same(got, want):
  for g, w in zip(_leaves(got), _leaves(want), strict=True):
    np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize(
    'name, kwargs',
    [(name, {}) for name in sorted(registry.ALGORITHMS)] +
    [(name, {'local_statistics': True})
     for name in ('afedcl', 'fedper', 'fedrep')] +
    [('fedcurv', {'fisher_window': 'previous_round'})])
def test_a_diverged_participation_leaves_the_client_state_untouched(
    name, kwargs):
  # A client whose participation diverges (NaN features) must come
  # back as it went in: its update is dropped and nothing it computed may
  # be kept, not even the participation count, because methods read
  # `num_participations > 0` as "has its own trained state" (MOON's
  # previous model, FedPSD's stored predictions and personal model, the
  # own BatchNorm statistics of `local_statistics`). Client 1 first joins
  # in round 2, after the global model has moved (so a fallback to the
  # global model would differ from its stored state), and diverges; its
  # finite round 3 is then its first participation; it diverges again in
  # round 4 and must keep its round-3 state.
  spec = _batch_norm_spec() if 'local_statistics' in kwargs else SPEC
  process = registry.build(
      name, spec, initial_weights=spec.initial_weights(seed=0),
      client_optimizer=tff.learning.optimizers.build_sgdm(0.1),
      server_optimizer=tff.learning.optimizers.build_sgdm(1.0),
      local_epochs=1, learning_rate_decay=1.0,
      run_context=dict(num_clients=2, total_rounds=4), **kwargs)
  (x0, y0), (x1, y1) = helpers.make_client_arrays(2)
  good = [_indexed_dataset(x0, y0), _indexed_dataset(x1, y1)]
  bad = _indexed_dataset(np.full_like(x1, np.nan), y1)
  initial = [process.initial_client_state(str(i)) for i in range(2)]

  state = process.initialize()
  state, (s0,), _ = process.next(state, initial[:1], good[:1])
  if name != 'nofl':   # No-FL has no global model to move.
    assert any(not np.array_equal(a, b) for a, b in zip(
        state.global_model_weights.trainable,
        spec.initial_weights(seed=0).trainable))

  state, (s0, s1), metrics = process.next(state, [s0, initial[1]],
                                          [good[0], bad])
  assert metrics['client_work']['non_finite'] == 1.0
  _assert_same(s1, initial[1])
  assert int(s1.num_participations) == 0

  state, (s0, s1), metrics = process.next(state, [s0, s1], good)
  assert metrics['client_work']['non_finite'] == 0.0
  assert int(s1.num_participations) == 1
  assert all(np.all(np.isfinite(t)) for t in _leaves([s0, s1]))

  state, (s0, s1_after), metrics = process.next(state, [s0, s1],
                                                [good[0], bad])
  assert metrics['client_work']['non_finite'] == 1.0
  _assert_same(s1_after, s1)


REGRESSION_SPEC = model_spec.ModelSpec(
    lambda: keras_models.build_model('mlp', (helpers.NUM_FEATURES,), 1,
                                     head='regression',
                                     encoder_options={'hidden': (8,)}),
    dict(SPEC.input_spec, y=tf.TensorSpec([None], tf.float32)),
    'regression', 1)


@pytest.mark.parametrize('name', sorted(registry.ALGORITHMS))
def test_classification_only_flag_matches_the_builder(name):
  # Programs refuse a regression data set from the flag, before any run;
  # the flag must say what the builder does.
  def build():
    return registry.build(
        name, REGRESSION_SPEC,
        initial_weights=REGRESSION_SPEC.initial_weights(seed=0),
        client_optimizer=tff.learning.optimizers.build_sgdm(0.1),
        local_epochs=1, run_context=dict(num_clients=3, total_rounds=5))
  if registry.ALGORITHMS[name].classification_only:
    with pytest.raises(ValueError, match='classification'):
      build()
    with pytest.raises(ValueError, match=f'{name} needs a classification '
                       "task .*, got 'regression'"):
      registry.check(name, {}, 'regression')
  else:
    assert build().name == name
    registry.check(name, {}, 'regression')


def test_check_refuses_unknown_names_and_hyperparameters_unbuilt():
  registry.check('fedprox', {'mu': 0.1}, 'classification')
  with pytest.raises(ValueError, match=r"fedprox does not take \['mu_'\]"):
    registry.check('fedprox', {'mu_': 0.1}, 'classification')
  with pytest.raises(ValueError, match="unknown algorithm 'fedporx'"):
    registry.check('fedporx', {}, 'classification')
  # Run-context entries are not hyperparameters.
  with pytest.raises(ValueError, match=r"does not take \['total_rounds'\]"):
    registry.check('fedpsd', {'total_rounds': 5}, 'classification')
