"""Tests for tff_pfl.algorithms.afedcl (afedcl.txt Eqs. 4-11)."""

import collections
import functools

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

import keras_models
from tff_pfl.algorithms import afedcl
from tff_pfl.core import model_spec
from tff_pfl.templates import fusion

from tests.tff_pfl import conftest as helpers


def _spec():
  return model_spec.ModelSpec(
      lambda: keras_models.build_model('mlp', (helpers.NUM_FEATURES,),
                                       helpers.NUM_CLASSES,
                                       encoder_options={'hidden': (8,)}),
      collections.OrderedDict(
          x=tf.TensorSpec([None, helpers.NUM_FEATURES], tf.float32),
          y=tf.TensorSpec([None], tf.int64)),
      'classification', helpers.NUM_CLASSES)


SPEC = _spec()
W0 = SPEC.initial_weights(seed=4)
ARRAYS = helpers.make_client_arrays(3)
DATA = [helpers.to_dataset(x, y) for x, y in ARRAYS]
N_ENC = 2   # the MLP encoder's kernel and bias


@functools.lru_cache(maxsize=None)
def _process(**kwargs):
  """One process per configuration: tests that run the same one share it
  (a process is stateless; building and first running it is what costs)."""
  return afedcl.build_afedcl(
      SPEC, initial_weights=W0,
      client_optimizer=tff.learning.optimizers.build_sgdm(0.1), **kwargs)


def _run(rounds=1, data=DATA, **kwargs):
  kwargs.setdefault('local_epochs', 2)
  process = _process(**kwargs)
  state = process.initialize()
  states = [process.initial_client_state(str(i)) for i in range(3)]
  for _ in range(rounds):
    state, states, metrics = process.next(state, states, data)
  return process, state, states, metrics


def test_all_switches_off_is_local_training():
  # Two rounds of 2 epochs: every round restarts from the client's own W_k
  # (Algorithm 1, line 11), so this is 4 epochs of local training (No-FL),
  # not FedPer (whose second round would start from the averaged encoder).
  _, state, states, metrics = _run(rounds=2, lambda_=0.0, dcc=False,
                                   caa=False, aff=False)
  model = helpers.eager_sgd(SPEC, W0, DATA[1], epochs=4, lr=0.1)
  for got, want in zip(states[1].model_weights.trainable,
                       model.trainable_variables):
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-5)
  # The server still averages the uploaded encoders by sample counts
  # (equal here: 24 samples per client), which nothing then reads.
  for i in range(N_ENC):
    np.testing.assert_allclose(
        state.global_model_weights.trainable[i],
        np.mean([s.model_weights.trainable[i] for s in states], axis=0),
        rtol=1e-5, atol=1e-6)
  assert metrics['client_work']['non_finite'] == 0


def test_client_state_carries_over_rounds():
  """Round 2 starts W, D and A from round 1's values (Algorithm 1, line 11)."""
  process, state1, states1, _ = _run(rounds=1, lambda_=1.0)
  _, _, two, _ = _run(rounds=2, lambda_=1.0)
  _, from_state, _ = process.next(state1, list(states1), DATA)
  fresh = [process.initial_client_state(str(i)) for i in range(3)]
  _, from_fresh, _ = process.next(state1, fresh, DATA)
  for a, b in zip(from_state, two):
    for x, y in zip(list(a.model_weights.trainable) + list(a.discriminator),
                    list(b.model_weights.trainable) + list(b.discriminator)):
      np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
    assert float(a.fusion_logit) == pytest.approx(float(b.fusion_logit),
                                                  rel=1e-5, abs=1e-7)
  # The same round from initial client states (same global model) differs
  # in each of W, D and A.
  for a, b in zip(from_fresh, two):
    assert not np.allclose(a.model_weights.trainable[0],
                           b.model_weights.trainable[0])
    assert not np.allclose(a.discriminator[0], b.discriminator[0])
    assert float(a.fusion_logit) != pytest.approx(float(b.fusion_logit))


def test_discrimination_accuracy_is_reported():
  # One batch, one epoch, round 1: the accuracy is taken on the forward pass
  # before the only update, when E_k = E_G = W0's encoder, so D gives each
  # sample the same logit as a local and as a global feature and is right
  # on exactly one of the two: 0.5 per client.
  one_batch = [helpers.to_dataset(x, y, batch_size=24) for x, y in ARRAYS]
  _, _, _, metrics = _run(data=one_batch, lambda_=1.0, local_epochs=1)
  acc = metrics['client_work']['discrimination_accuracy']   # sum over 3
  assert acc == pytest.approx(1.5, abs=1e-6)
  # After training, D tells them apart better than chance.
  _, _, _, metrics = _run(rounds=3, lambda_=0.0)
  assert metrics['client_work']['discrimination_accuracy'] > 1.5


def test_consensus_aware_aggregation_is_eq8():
  _, state, states, metrics = _run(lambda_=1.0, aff=False)
  ld = np.array([float(s.discrimination_loss) for s in states])
  assert np.all(ld > 0) and not np.allclose(ld, ld[0])
  for i in range(N_ENC):
    expected = sum(l * s.model_weights.trainable[i]
                   for l, s in zip(ld, states)) / ld.sum()
    np.testing.assert_allclose(state.global_model_weights.trainable[i],
                               expected, rtol=1e-5, atol=1e-6)
  # The classifier is never shared: the global head stays at W0.
  np.testing.assert_array_equal(state.global_model_weights.trainable[-1],
                                W0.trainable[-1])
  assert metrics['aggregator']['fell_back_to_counts'] == 0
  assert metrics['client_work']['discrimination_loss'] == pytest.approx(
      ld.sum(), rel=1e-5)
  # The upload is E_k after stage 1 (Algorithm 1): with stage 2 on, round
  # 1's stage 1, and so the new global encoder, is the same, while the
  # clients' encoders move on in stage 2.
  _, fused_state, fused, _ = _run(lambda_=1.0)
  for i in range(N_ENC):
    np.testing.assert_allclose(fused_state.global_model_weights.trainable[i],
                               state.global_model_weights.trainable[i],
                               rtol=1e-5, atol=1e-6)
  assert not np.allclose(fused[0].model_weights.trainable[0],
                         states[0].model_weights.trainable[0])


def test_count_mix_blends_eq8_with_sample_counts():
  # count_mix=1 is the sample-count mean (CAA off), 0.5 the midpoint of
  # that and Eq. 8: the local training is the same, only the mean moves.
  _, eq8, _, _ = _run(lambda_=1.0, aff=False)
  _, counts, _, _ = _run(lambda_=1.0, aff=False, caa=False)
  _, all_counts, _, _ = _run(lambda_=1.0, aff=False, count_mix=1.0)
  _, half, _, _ = _run(lambda_=1.0, aff=False, count_mix=0.5)
  for i in range(N_ENC):
    e = eq8.global_model_weights.trainable[i]
    c = counts.global_model_weights.trainable[i]
    assert not np.allclose(e, c)
    np.testing.assert_allclose(all_counts.global_model_weights.trainable[i],
                               c, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(half.global_model_weights.trainable[i],
                               (e + c) / 2, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('switch', ['dcc', 'caa', 'aff'])
def test_each_switch_changes_the_result(switch):
  _, on_state, on, _ = _run(rounds=2, lambda_=1.0)
  _, off_state, off, _ = _run(rounds=2, lambda_=1.0, **{switch: False})
  if switch == 'caa':      # only the aggregation differs
    assert not np.allclose(on_state.global_model_weights.trainable[0],
                           off_state.global_model_weights.trainable[0])
  else:
    assert not np.allclose(on[0].model_weights.trainable[0],
                           off[0].model_weights.trainable[0])
  if switch == 'aff':      # without stage 2 the fusion weight never moves
    assert float(off[0].fusion_logit) == 0.0
    assert float(on[0].fusion_logit) != 0.0


def test_personalized_model_is_the_fused_model():
  process, state, states, _ = _run(rounds=2)
  stats = process.evaluate(state, states, DATA)
  assert set(stats) == {'personal'}
  a = float(fusion.fusion_weight(states[0].fusion_logit))
  assert 0.0 < a < 1.0
  local = SPEC.keras_model_fn()
  model_spec.assign_weights(local, states[0].model_weights)
  glob = SPEC.keras_model_fn()
  model_spec.assign_weights(glob, state.global_model_weights)
  x, y = ARRAYS[0]
  f = (a * glob.get_layer('encoder')(x) +
       (1 - a) * local.get_layer('encoder')(x))
  logits = local.get_layer('head')(f)
  loss = float(tf.reduce_sum(tf.keras.losses.sparse_categorical_crossentropy(
      y, logits, from_logits=True)))
  assert stats['personal'][0]['loss_sum'] == pytest.approx(loss, rel=1e-4)


def test_bad_arguments():
  opt = tff.learning.optimizers.build_sgdm(0.1)
  with pytest.raises(ValueError, match='lambda_'):
    afedcl.build_afedcl(SPEC, initial_weights=W0, client_optimizer=opt,
                        lambda_=-1.0)
  with pytest.raises(ValueError, match='initial_fusion_weight'):
    afedcl.build_afedcl(SPEC, initial_weights=W0, client_optimizer=opt,
                        initial_fusion_weight=1.0)
  with pytest.raises(ValueError, match='count_mix'):
    afedcl.build_afedcl(SPEC, initial_weights=W0, client_optimizer=opt,
                        count_mix=1.5)
  plain = helpers.make_spec()
  with pytest.raises(ValueError, match="'encoder' and 'head'"):
    afedcl.build_afedcl(plain, initial_weights=plain.initial_weights(0),
                        client_optimizer=opt)


def _batch_norm_spec():
  """The test MLP with a BatchNorm layer in its encoder."""
  return helpers.make_batch_norm_encoder_head_spec(SPEC.input_spec)


def test_local_statistics_run_the_global_encoder_with_the_clients_own():
  """`local_statistics=True`: from its second round on a client runs E_G
  with the BatchNorm statistics it estimated on its own data, in training
  and in the evaluated fused model, whatever the server's statistics; by
  default E_G runs with the server's (averaged) ones."""
  spec = _batch_norm_spec()
  w0 = spec.initial_weights(seed=4)

  def two_rounds(local_statistics):
    process = afedcl.build_afedcl(
        spec, initial_weights=w0, local_statistics=local_statistics,
        lambda_=1.0, client_optimizer=tff.learning.optimizers.build_sgdm(0.1))
    state, shifted, states = helpers.round_then_shift_statistics(process,
                                                                 DATA)
    _, a, _ = process.next(state, list(states), DATA)
    _, b, _ = process.next(shifted, list(states), DATA)
    fresh = [process.initial_client_state(str(i)) for i in range(3)]
    # [own, first-time] x [server statistics, shifted ones]
    evaluations = [
        [r['loss_sum'] for r in process.evaluate(s, c, DATA)['personal']]
        for c in (states, fresh) for s in (state, shifted)]
    return process, state, shifted, states, a, b, evaluations

  process, state, shifted, states, a, b, evaluations = two_rounds(True)
  own, own_shifted, fresh, fresh_shifted = evaluations
  np.testing.assert_allclose(own, own_shifted, rtol=1e-6)
  for x, y in zip(a, b):
    for u, v in zip(
        list(x.model_weights.trainable) + list(x.model_weights.non_trainable)
        + list(x.discriminator) + list(x.global_statistics) +
        [x.fusion_logit],
        list(y.model_weights.trainable) + list(y.model_weights.non_trainable)
        + list(y.discriminator) + list(y.global_statistics) +
        [y.fusion_logit]):
      np.testing.assert_allclose(u, v, rtol=1e-6, atol=1e-7)
  # So are the fused features (eager, from numpy client states, Fig. 7).
  x0 = ARRAYS[0][0]
  np.testing.assert_allclose(
      process.personal_features(state.global_model_weights, states[0], x0),
      process.personal_features(shifted.global_model_weights, states[0], x0),
      rtol=1e-6)
  # A first-time client runs E_G with the server's statistics.
  for x, y in zip(fresh, fresh_shifted):
    assert x != pytest.approx(y, rel=1e-3)
  # Round 1 estimated E_G's statistics on each client's data: they moved
  # from the broadcast (initial) ones, differently per client, and are not
  # E_k's statistics.
  moving_mean = [s.global_statistics[0] for s in states]
  assert not np.allclose(moving_mean[0], w0.non_trainable[0])
  assert not np.allclose(moving_mean[0], moving_mean[1])
  assert not np.allclose(moving_mean[0],
                         states[0].model_weights.non_trainable[0])
  # The evaluated model is C_k(A E_G(x) + (1 - A) E_k(x)) with E_G's
  # weights from the server and its statistics from the client.
  stats = process.evaluate(state, states, DATA)
  for k, (x, y) in enumerate(ARRAYS):
    local = spec.keras_model_fn()
    model_spec.assign_weights(local, states[k].model_weights)
    glob = spec.keras_model_fn()
    model_spec.assign_weights(glob, tff.learning.models.ModelWeights(
        trainable=state.global_model_weights.trainable,
        non_trainable=list(states[k].global_statistics)))
    a_k = float(fusion.fusion_weight(states[k].fusion_logit))
    f = (a_k * glob.get_layer('encoder')(x, training=False) +
         (1 - a_k) * local.get_layer('encoder')(x, training=False))
    logits = local.get_layer('head')(f, training=False)
    want = float(tf.reduce_sum(tf.keras.losses.sparse_categorical_crossentropy(
        y, logits, from_logits=True)))
    assert stats['personal'][k]['loss_sum'] == pytest.approx(want, rel=1e-5)
  # By default the +3 shift of the server's statistics moves every
  # client's evaluation and its next round.
  _, _, _, _, a, b, evaluations = two_rounds(False)
  for x, y in zip(evaluations[0], evaluations[1]):   # own, shifted
    assert x != pytest.approx(y, rel=1e-3)
  assert not np.allclose(a[0].model_weights.trainable[0],
                         b[0].model_weights.trainable[0])
  with pytest.raises(ValueError, match='no non-trainable weights'):
    afedcl.build_afedcl(SPEC, initial_weights=W0, local_statistics=True,
                        client_optimizer=tff.learning.optimizers.build_sgdm(
                            0.1))


def test_keep_global_encoder_evaluates_with_the_encoder_of_the_last_round():
  """`keep_global_encoder=True`: after round t a client's fused model holds
  E_G^t with the statistics E_G ran with in that round (the broadcast
  ones, or with `local_statistics` its own), not E_G^{t+1}: it evaluates
  as the default process does from the round's starting server state,
  whatever server state it is given. Training is unchanged and a
  first-time client uses the broadcast encoder."""
  spec = _batch_norm_spec()
  w0 = spec.initial_weights(seed=4)
  n_enc = len(spec.keras_model_fn().get_layer('encoder').trainable_weights)

  def personal_losses(process, server_state, client_states):
    return [r['loss_sum'] for r in
            process.evaluate(server_state, client_states, DATA)['personal']]

  def shift(server_state, by):
    weights = server_state.global_model_weights
    return server_state._replace(
        global_model_weights=tff.learning.models.ModelWeights(
            trainable=[np.asarray(t) + by for t in weights.trainable],
            non_trainable=[np.asarray(t) + by
                           for t in weights.non_trainable]))

  for local_statistics in (False, True):
    runs = {}
    for keep in (True, False):
      process = afedcl.build_afedcl(
          spec, initial_weights=w0, lambda_=1.0,
          local_statistics=local_statistics, keep_global_encoder=keep,
          client_optimizer=tff.learning.optimizers.build_sgdm(0.1))
      start = process.initialize()
      fresh = [process.initial_client_state(str(i)) for i in range(3)]
      state, states, _ = process.next(start, fresh, DATA)
      runs[keep] = (process, start, state, states, fresh)
    kept, k_start, k_state, k_states, k_fresh = runs[True]
    default, d_start, d_state, d_states, d_fresh = runs[False]
    # Training is the default's: the same W_k, D_k and E_G^{t+1}.
    for x, y in zip(k_states, d_states):
      for u, v in zip(
          list(x.model_weights.trainable) + list(x.discriminator),
          list(y.model_weights.trainable) + list(y.discriminator)):
        np.testing.assert_allclose(u, v, rtol=1e-6, atol=1e-7)
    for u, v in zip(k_state.global_model_weights.trainable,
                    d_state.global_model_weights.trainable):
      np.testing.assert_allclose(u, v, rtol=1e-6, atol=1e-7)
    # The client kept E_G^t, the encoder broadcast in its round.
    for x in k_states:
      assert len(x.global_encoder) == n_enc
      for u, v in zip(x.global_encoder,
                      k_start.global_model_weights.trainable[:n_enc]):
        np.testing.assert_allclose(u, v)
    got = personal_losses(kept, k_state, k_states)
    np.testing.assert_allclose(
        got, personal_losses(default, d_start, d_states), rtol=1e-5)
    for x, y in zip(got, personal_losses(default, d_state, d_states)):
      assert x != pytest.approx(y, rel=1e-3)   # E_G^{t+1} reads otherwise
    np.testing.assert_allclose(
        got, personal_losses(kept, shift(k_state, 3.0), k_states),
        rtol=1e-6)
    x0 = ARRAYS[0][0]
    np.testing.assert_allclose(
        kept.personal_features(k_state.global_model_weights, k_states[0],
                               x0),
        kept.personal_features(shift(k_state, 3.0).global_model_weights,
                               k_states[0], x0), rtol=1e-6)
    # A client that has not trained yet fuses the broadcast encoder.
    np.testing.assert_allclose(personal_losses(kept, k_state, k_fresh),
                               personal_losses(default, d_state, d_fresh),
                               rtol=1e-6)
  with pytest.raises(ValueError, match='needs aff=True'):
    afedcl.build_afedcl(spec, initial_weights=w0, aff=False,
                        keep_global_encoder=True,
                        client_optimizer=tff.learning.optimizers.build_sgdm(
                            0.1))
