"""Tests for tff_pfl.core.loop (with FedAvg and No-FL as the processes)."""

import dataclasses

import numpy as np
import pytest
import tensorflow_federated as tff

from tff_pfl.algorithms import fedavg
from tff_pfl.algorithms import nofl
from tff_pfl.core import client_state
from tff_pfl.core import loop
from tff_pfl.core import sampling

from tests.tff_pfl import conftest as helpers

IDS = [f'client_{i:03d}' for i in range(4)]


def _dataset_fn(arrays):
  by_id = dict(zip(IDS, arrays))

  def fn(client_id, round_num, split):
    del round_num, split
    return helpers.to_dataset(*by_id[client_id])
  return fn


def test_evaluates_every_client_and_names_best_rounds():
  spec = helpers.make_spec()
  process = nofl.build_nofl(
      spec, initial_weights=spec.initial_weights(0),
      client_optimizer=tff.learning.optimizers.build_sgdm(0.1))
  store = client_state.MemoryStore(process.initial_client_state)
  sampler = sampling.ParticipationStream(IDS, clients_per_round=2, seed=0)
  seen = []
  result = loop.run(process, client_ids=IDS,
                    dataset_fn=_dataset_fn(helpers.make_client_arrays(4)),
                    sampler=sampler, rounds=4, store=store, eval_every=2,
                    progress=lambda r, row: seen.append(r))
  assert seen == [1, 2, 3, 4]
  # Rounds 2 and 4 evaluate all 4 clients, not only the 2 sampled ones.
  assert len(result.clients) == 8
  assert {r['client'] for r in result.clients} == set(IDS)
  assert [r['round'] for r in result.rounds] == [1, 2, 3, 4]
  assert 'test/personal/accuracy_mean' in result.rounds[1]
  assert 'test/personal/accuracy_mean' not in result.rounds[0]
  assert result.final['round'] == 4
  evaluated = {r['round']: r['test/personal/accuracy_mean']
               for r in result.rounds if 'test/personal/accuracy_mean' in r}
  assert list(evaluated) == [2, 4]
  # The best round is the first with the highest accuracy.
  assert result.best_test['round'] == max(evaluated, key=evaluated.get)
  assert result.best_test['personal/accuracy_mean'] == max(
      evaluated.values())
  assert result.best_val is None
  # Only sampled clients were trained: participation counts add up to 2*4.
  counts = [int(store.get(c).num_participations) for c in IDS]
  assert sum(counts) == 8
  for r in range(1, 5):
    assert sorted(sampler.sample(r)) == sampler.sample(r)


def test_all_clients_diverging_raises_and_keeps_states():
  spec = helpers.make_spec()
  process = fedavg.build_fedavg(
      spec, initial_weights=spec.initial_weights(0),
      client_optimizer=tff.learning.optimizers.build_sgdm(0.1))
  store = client_state.MemoryStore(process.initial_client_state)
  bad = [(np.full_like(x, np.nan), y)
         for x, y in helpers.make_client_arrays(4)]
  with pytest.raises(loop.NonFiniteError, match='round 1'):
    loop.run(process, client_ids=IDS, dataset_fn=_dataset_fn(bad),
             sampler=sampling.ParticipationStream(IDS, clients_per_round=4,
                                                  seed=0),
             rounds=2, store=store)
  assert list(store.client_ids()) == []   # nothing diverged was stored


def test_derive_seed_is_stable_and_distinct():
  assert loop.derive_seed(0, 1, 'a') == loop.derive_seed(0, 1, 'a')
  assert loop.derive_seed(0, 1, 'a') != loop.derive_seed(0, 2, 'a')
  assert 0 <= loop.derive_seed('x') < 2**31


def test_local_eval_reports_the_cohorts_models_before_aggregation():
  spec = helpers.make_spec()
  process = fedavg.build_fedavg(
      spec, initial_weights=spec.initial_weights(0),
      client_optimizer=tff.learning.optimizers.build_sgdm(0.1))
  arrays = helpers.make_client_arrays(4)
  # One sampled client: the averaged model IS its local model, and `next`
  # and `next_with_local_models` compute the same round.
  state = process.initialize()
  states = [process.initial_client_state(IDS[0])]
  data = [helpers.to_dataset(*arrays[0])]
  plain = process.next(state, states, data)
  out = process.next_with_local_models(state, states, data)
  for a, b, c in zip(out.local_models[0].trainable,
                     out.server_state.global_model_weights.trainable,
                     plain.server_state.global_model_weights.trainable):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b, c, rtol=1e-6, atol=1e-7)
  # A different model gives different local statistics than the global one.
  stats = process.evaluate_models([state.global_model_weights,
                                   out.local_models[0]], data * 2)
  assert float(stats[0]['loss_sum']) != float(stats[1]['loss_sum'])
  # The eager evaluator (for centralized test sets) computes the same.
  eager = process.evaluate_weights(out.local_models[0], data[0])
  np.testing.assert_array_equal(eager['confusion'], stats[1]['confusion'])
  np.testing.assert_allclose(eager['loss_sum'], stats[1]['loss_sum'],
                             rtol=1e-5)

  store = client_state.MemoryStore(process.initial_client_state)
  pooled = helpers.to_dataset(np.concatenate([x for x, _ in arrays]),
                              np.concatenate([y for _, y in arrays]))
  result = loop.run(process, client_ids=IDS, dataset_fn=_dataset_fn(arrays),
                    sampler=sampling.ParticipationStream(
                        IDS, clients_per_round=2, seed=0),
                    rounds=2, store=store, eval_every=2, local_eval=True,
                    pooled_test=pooled)
  final = result.final
  for key in ('local/accuracy_mean', 'local_pooled/accuracy_mean',
              'personal/accuracy_mean'):
    assert 0.0 <= final[key] <= 1.0, key
  assert 'test/local/accuracy_mean' not in result.rounds[0]
  assert final['local/accuracy_mean'] != final['personal/accuracy_mean']
  # One client per round: FedAvg's new global model is that client's local
  # model, so local_pooled is the global model's accuracy on the pooled set
  # (not on the client's own split, which local/ reports).
  one = loop.run(process, client_ids=IDS, dataset_fn=_dataset_fn(arrays),
                 sampler=sampling.ParticipationStream(
                     IDS, clients_per_round=1, seed=0),
                 rounds=2, store=client_state.MemoryStore(
                     process.initial_client_state),
                 eval_every=2, local_eval=True, pooled_test=pooled)
  confusion = np.asarray(process.evaluate_weights(
      one.server_state.global_model_weights, pooled)['confusion'])
  assert one.final['local_pooled/accuracy_mean'] == pytest.approx(
      np.trace(confusion) / confusion.sum(), abs=1e-6)
  assert (one.final['local_pooled/accuracy_mean']
          != one.final['local/accuracy_mean'])


def test_local_eval_needs_a_method_reporting_local_models():
  spec = helpers.make_spec()
  process = fedavg.build_fedavg(
      spec, initial_weights=spec.initial_weights(0),
      client_optimizer=tff.learning.optimizers.build_sgdm(0.1))
  process = dataclasses.replace(process, local_models_fns=None)
  with pytest.raises(ValueError, match='local_eval'):
    loop.run(process, client_ids=IDS,
             dataset_fn=_dataset_fn(helpers.make_client_arrays(4)),
             sampler=sampling.ParticipationStream(IDS, clients_per_round=2,
                                                  seed=0),
             rounds=1, store=client_state.MemoryStore(
                 process.initial_client_state), local_eval=True)


class _CountingStore(client_state.MemoryStore):
  """A memory store that records which clients' states were read."""

  def __init__(self, initial_state_fn):
    super().__init__(initial_state_fn)
    self.reads = []

  def get_many(self, client_ids):
    self.reads.extend(client_ids)
    return super().get_many(client_ids)


def test_evaluation_reads_client_states_only_for_personalized_models():
  spec = helpers.make_spec()
  arrays = helpers.make_client_arrays(4)
  dataset_fn = _dataset_fn(arrays)
  optimizer = tff.learning.optimizers.build_sgdm(0.1)
  summaries = {}
  for name, build in (('fedavg', fedavg.build_fedavg),
                      ('nofl', nofl.build_nofl)):
    process = build(spec, initial_weights=spec.initial_weights(0),
                    client_optimizer=optimizer)
    store = _CountingStore(process.initial_client_state)
    summaries[name], rows = loop.evaluate_all(
        process, process.initialize(), store, IDS, dataset_fn, 'test', 0,
        chunk_size=3)
    assert [r['client'] for r in rows] == IDS
    # FedAvg's personalized model is the global model: its evaluation
    # takes no client states, and the store is not read.
    assert process.evaluate_reads_client_states == (name == 'nofl')
    assert store.reads == (IDS if name == 'nofl' else [])
  data = [helpers.to_dataset(x, y) for x, y in arrays]
  process = fedavg.build_fedavg(spec, initial_weights=spec.initial_weights(0),
                                client_optimizer=optimizer)
  state = process.initialize()
  states = [process.initial_client_state(c) for c in IDS]
  # The states, if given, are ignored; the result is the global model's.
  with_states = process.evaluate(state, states, data)
  without = process.evaluate(state, None, data)
  assert list(with_states) == ['global']
  for a, b in zip(with_states['global'], without['global']):
    assert float(a['loss_sum']) == float(b['loss_sum'])
  assert summaries['fedavg']['personal/accuracy_mean'] == summaries['fedavg'][
      'global/accuracy_mean']
  expected = np.mean([
      np.trace(np.asarray(s['confusion'])) / float(s['num_examples'])
      for s in without['global']])
  np.testing.assert_allclose(summaries['fedavg']['global/accuracy_mean'],
                             expected, rtol=1e-6)
