"""Tests for tff_pfl.algorithms.registry: every name builds, typos fail."""

import pytest
import tensorflow as tf
import tensorflow_federated as tff

import keras_models

from tff_pfl.algorithms import registry
from tff_pfl.core import model_spec

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
