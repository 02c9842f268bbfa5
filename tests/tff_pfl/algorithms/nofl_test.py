"""Tests for tff_pfl.algorithms.nofl."""

import numpy as np
import tensorflow_federated as tff

from tff_pfl.algorithms import fedavg
from tff_pfl.algorithms import nofl

from tests.tff_pfl import conftest as helpers


def _build(spec, w0, build=nofl.build_nofl, lr=0.1, epochs=1):
  return build(spec, initial_weights=w0, local_epochs=epochs,
               client_optimizer=tff.learning.optimizers.build_sgdm(lr))


def test_personal_model_is_plain_local_sgd():
  """One round of No-FL equals eager mini-batch SGD on the client's data."""
  spec = helpers.make_spec()
  w0 = spec.initial_weights(seed=2)
  arrays = helpers.make_client_arrays(2)
  data = [helpers.to_dataset(x, y) for x, y in arrays]
  process = _build(spec, w0, epochs=2)
  state = process.initialize()
  states = [process.initial_client_state(str(i)) for i in range(2)]
  state, states, _ = process.next(state, states, data)

  model = helpers.eager_sgd(spec, w0, data[1], epochs=2, lr=0.1)
  for got, want in zip(states[1].model_weights.trainable,
                       model.trainable_variables):
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-6)
  # Personal models differ between clients; the global model never moves.
  assert not np.allclose(states[0].model_weights.trainable[0],
                         states[1].model_weights.trainable[0])
  for a, b in zip(state.global_model_weights.trainable, w0.trainable):
    np.testing.assert_array_equal(a, b)
  assert int(states[0].num_participations) == 1


def test_evaluates_personal_models_only_and_differs_from_fedavg():
  spec = helpers.make_spec()
  w0 = spec.initial_weights(seed=0)
  data = [helpers.to_dataset(x, y) for x, y in helpers.make_client_arrays(3)]
  results = {}
  for name, build in (('nofl', nofl.build_nofl), ('fedavg',
                                                    fedavg.build_fedavg)):
    process = _build(spec, w0, build)
    state = process.initialize()
    states = [process.initial_client_state(str(i)) for i in range(3)]
    for _ in range(3):
      state, states, _ = process.next(state, states, data)
    results[name] = process.evaluate(state, states, data)
  assert set(results['nofl']) == {'personal'}
  assert set(results['fedavg']) == {'global'}
  nofl_loss = [s['loss_sum'] for s in results['nofl']['personal']]
  fedavg_loss = [s['loss_sum'] for s in results['fedavg']['global']]
  assert not np.allclose(nofl_loss, fedavg_loss)
