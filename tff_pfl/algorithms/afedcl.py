"""AFedCL: adversarial federated consensus learning (afedcl.txt, Section IV).

Per client k, persistent across rounds (Algorithm 1, line 11): the local
encoder E_k and classifier C_k (together W_k), a discriminator D_k (two dense
layers) and the fusion weight A_k = sigmoid(a_k). Each round t, given the
global encoder E_G^t (frozen on the client):

Stage 1, dynamic consensus construction (DCC), `local_epochs` epochs:
  L_C = CE(C_k(E_k(x)), y)                                         (Eq. 4)
  L_D = 1/(2|S|) [sum BCE(D_k(E_k(x)), 0) + sum BCE(D_k(E_G(x)), 1)] (Eq. 5)
  E_k <- E_k - alpha (dL_C/dE_k - lambda dL_D/dE_k)                 (Eq. 7)
  C_k <- C_k - alpha dL_C/dC_k,   D_k <- D_k - alpha dL_D/dD_k   (Alg. 1)
  The encoder's -lambda dL_D comes from a gradient reversal layer
  (`keras_models.reverse_gradient`) between E_k and D_k; D_k itself gets
  dL_D unscaled (Algorithm 1, line 15). Eq. 7 as printed scales D_k's step
  by lambda as well; the two disagree, and with Adam (the paper's
  optimizer, Table I) a constant factor on one loss's gradient changes the
  step little, while with SGD D_k would learn 1/lambda times slower under
  Eq. 7's reading.
Upload E_k and L_D^k (the mean over every batch of stage 1, as the
training loss is reported; the discriminator's accuracy on the same batches
is reported beside it for Fig. 4); the server forms
  E_G^{t+1} = sum_k L_D^k E_k / sum_k L_D^k                         (Eq. 8)
  with `templates.weighted_aggregation.ScoreWeightedMeanFactory` (scores
  sanitised and clipped; sample-count fallback when they sum to zero).
  `count_mix = beta` (default 0, Eq. 8 as written) forms instead
  (1 - beta) x Eq. 8 + beta x the sample-count mean, which bounds any
  client's share by (1 - beta) + beta n_k / n (not in the paper; see the
  defaults below for why).
Stage 2, adaptive feature fusion (AFF), `local_epochs` epochs:
  f = A_k E_G(x) + (1 - A_k) E_k(x)                                 (Eq. 9)
  minimise L_C' = CE(C_k(f), y) over E_k, C_k and a_k          (Eqs. 10-11)
The personalized model that is evaluated is x -> C_k(A_k E_G(x) + (1-A_k)
E_k(x)) with the current global encoder: after round t that is E_G^{t+1},
the newest one (Algorithm 1 ends each round, the last included, with Eq. 8),
while C_k and A_k were last fitted against E_G^t. The paper does not say
which E_G its deployed model ("offline training, online inference") fuses;
Algorithm 1 outputs only {W_k^T}. Evaluating with E_G^t instead changes
little and does not favour either: on the 200-round NEU-CLS cells at seed
0 (disjoint 2 with 5 and 10 shots, Dirichlet 0.1 with 5), the difference
E_G^{t+1} minus E_G^t over the 20 evaluations averaged -0.10, +0.11 and
+0.71 points (within -3.6 and +7.1; docs/results.md, "Which global
encoder the fused model is evaluated with").

Ablation switches (Fig. 10): `dcc=False` removes the L_D gradient from the
encoder (the paper's "sub-experiment": D_k still trains and L_D is still
reported); `caa=False` aggregates with sample-count weights; `aff=False`
skips stage 2 and evaluates C_k(E_k(x)). With lambda = 0 and all three
off, W_k is trained on L_C alone from its own previous values, since
Algorithm 1 (line 11) starts every round from the client's last W_k, not
from E_G: this is local training of the whole model (No-FL), while the
server still averages the uploaded encoders, which nothing then reads
(tested over several rounds). FedPer, which the issue names, differs in one
point only: it starts each round's encoder from the average; with the
switches on, AFedCL reaches the average through L_D and the fusion instead.

BatchNorm statistics of E_G (`local_statistics`). The global encoder's
non-trainable weights (BatchNorm moving statistics) are by default the
server's, i.e. the average of the clients' E_k statistics (TFF's treatment,
`finalizers`), and E_G runs in inference mode with them in both stages and
in the fused model: a client with two classes normalises its E_G features
with statistics of every client's data. With `local_statistics=True` E_G's
statistics are the client's own, estimated for E_G on its data, as FedBN
keeps normalisation local: in both stages E_G runs in training mode
(normalising with batch statistics, as E_k does; its weights stay frozen,
only the moving statistics move; an encoder with dropout also drops
units there) starting from the statistics the client kept after its
previous round, and the fused model (with `aff`) is evaluated with them.
A first-time client starts from the broadcast ones. The upload (E_k after
stage 1, with E_k's statistics) is unchanged. This is FedPer/FedRep's
`local_statistics` (`templates.personal_head`) for AFedCL's shared part;
the paper does not say how its global encoder's normalisation is run.

Which E_G the evaluated model holds (`keep_global_encoder`). With
`local_statistics` the statistics a client keeps were estimated for E_G^t,
the encoder of its last round, but by default its fused model is evaluated
with E_G^{t+1}: a pairing of weights and statistics that never ran together.
On ResNet-50 this made the fused model's test loss swing by two orders of
magnitude between evaluations (docs/results.md, "AFedCL with local
statistics: which E_G the fused model holds"). With
`keep_global_encoder=True` the client keeps E_G^t's weights and the
statistics E_G ran with in that round (its own with `local_statistics`, else
the broadcast ones), and its fused model uses them until its next round: the
model the client actually holds. It changes no training, only which E_G the
fused model (and Fig. 7's features) read, and costs one copy of the encoder
per client state.

Defaults: lambda = 0.1 (the paper picks lambda from {0.01, 0.1, 1} per data
set), A_k starts at 0.5 (a_k = 0), discriminator hidden width 256 (the paper
says "two dense layers" without widths), L_D clip bound 10 (our choice:
ln 2 ~ 0.69 is the loss of a discriminator that cannot tell the features
apart, but the reversed gradient lets an encoder drive L_D well above it;
on NEU-CLS clients' L_D reached 8.8, so a bound near ln 2 would flatten
CAA into plain averaging. With K clients at L_D ~ l, one client at the bound
B gets at most B / (B + (K - 1) l) of the weight, which is all of it
when the others' L_D fall to ~0, as they did by round 200 on NEU-CLS;
`count_mix` bounds the share). The global model's
classifier is never trained, so only the personalized (fused) model is
evaluated. The paper trains with Adam (lr 1e-3,
beta1 0.9): pass `tff.learning.optimizers.build_adam(1e-3)`.
"""

import collections
from typing import Any, NamedTuple, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

import keras_models
from tff_pfl.core import model_spec as model_spec_lib
from tff_pfl.core import process as process_lib
from tff_pfl.templates import client_works
from tff_pfl.templates import evaluation
from tff_pfl.templates import fusion
from tff_pfl.templates import local_training
from tff_pfl.templates import weighted_aggregation

ModelWeights = tff.learning.models.ModelWeights


class AFedCLClientState(NamedTuple):
  """Client k's state; the last two fields are empty lists unless
  `local_statistics` or `keep_global_encoder` asks for them."""
  model_weights: Any            # W_k = (E_k, C_k), full ModelWeights
  discriminator: Any            # D_k trainable tensors
  fusion_logit: Any             # a_k, A_k = sigmoid(a_k)
  discrimination_loss: Any      # L_D^k of the last round (for Fig. 5)
  num_participations: Any
  # E_G's non-trainable tensors (BatchNorm statistics) as E_G ran with
  # them in the client's last round: the client's own with
  # `local_statistics`, else the broadcast ones (kept only with
  # `keep_global_encoder`).
  global_statistics: Any
  # E_G^t's trainable tensors, the global encoder of the client's last
  # round (`keep_global_encoder`).
  global_encoder: Any


def build_afedcl(
    spec: model_spec_lib.ModelSpec,
    *,
    initial_weights: ModelWeights,
    client_optimizer: tff.learning.optimizers.Optimizer,
    server_optimizer: Optional[tff.learning.optimizers.Optimizer] = None,
    local_epochs: int = 1,
    learning_rate_decay: float = 1.0,
    lambda_: float = 0.1,
    dcc: bool = True,
    caa: bool = True,
    aff: bool = True,
    initial_fusion_weight: float = 0.5,
    discriminator_hidden: int = 256,
    max_discrimination_loss: float = 10.0,
    count_mix: float = 0.0,
    local_statistics: bool = False,
    keep_global_encoder: bool = False,
    seed: int = 0,
) -> process_lib.PersonalizedProcess:
  """Builds AFedCL; see the module docstring for the method and switches.

  Args:
    spec: model spec whose Keras model has 'encoder' and 'head' sub-models.
    initial_weights: seeded initial weights of (E, C).
    client_optimizer: TFF optimizer for both stages (paper: Adam 1e-3).
    server_optimizer: applied to the aggregated encoder delta; default SGD
      at 1.0, i.e. E_G^{t+1} is exactly the weighted mean of Eq. 8.
    local_epochs: epochs of each stage (paper: 3).
    learning_rate_decay: per-round client learning-rate decay.
    lambda_: gradient-reversal weight lambda >= 0 (Eq. 7).
    dcc, caa, aff: the ablation switches.
    initial_fusion_weight: A_k at the start, in (0, 1).
    discriminator_hidden: width of D_k's hidden layer.
    max_discrimination_loss: clip bound of reported L_D values.
    count_mix: share beta of the aggregation weight given by sample counts
      instead of L_D (0 = Eq. 8 as written); bounds any one client's share
      by (1 - beta) + beta n_k / n, which the clip alone does not
      (`templates.weighted_aggregation`).
    local_statistics: run E_G with the client's own BatchNorm statistics
      instead of the server's averaged ones (module docstring).
    keep_global_encoder: evaluate the fused model with the global encoder
      of the client's last round, E_G^t with the statistics it ran with,
      instead of the newest E_G^{t+1} (module docstring).
    seed: seeds the discriminators' initial weights.
  """
  if lambda_ < 0:
    raise ValueError(f'AFedCL lambda_ must be >= 0, got {lambda_}.')
  if not 0.0 < initial_fusion_weight < 1.0:
    raise ValueError('initial_fusion_weight must be in (0, 1), got '
                     f'{initial_fusion_weight}.')
  if local_epochs < 1:
    raise ValueError(f'local_epochs must be >= 1, got {local_epochs}.')
  aggregator = weighted_aggregation.ScoreWeightedMeanFactory(
      max_score=max_discrimination_loss, use_score=caa, count_mix=count_mix)
  feature_dim, n_enc, n_enc_nt = spec.encoder_sizes('AFedCL')
  if local_statistics and not n_enc_nt:
    raise ValueError(
        'AFedCL local_statistics=True but the encoder has no non-trainable '
        'weights (no BatchNorm): there are no statistics to keep local.')
  if keep_global_encoder and not aff:
    raise ValueError(
        'AFedCL keep_global_encoder=True needs aff=True: without adaptive '
        'feature fusion the evaluated model C_k(E_k(x)) reads no global '
        'encoder to keep.')
  grl_weight = float(lambda_) if dcc else 0.0
  # E_G normalises with batch statistics in training when its statistics
  # are the client's (and so moves them); with the server's, it never does.
  global_training = bool(local_statistics)

  def make_discriminator():
    return keras_models.build_discriminator(feature_dim,
                                            hidden=discriminator_hidden)

  tf.keras.utils.set_random_seed(int(seed) + 7919)
  init_disc = [np.array(v.numpy())
               for v in make_discriminator().trainable_weights]
  init_logit = np.float32(np.log(initial_fusion_weight /
                                 (1.0 - initial_fusion_weight)))

  weights_type = spec.weights_type()
  broadcast_type = process_lib.broadcast_type(weights_type)
  state_fields = dict(
      model_weights=weights_type,
      discriminator=[tf.TensorSpec(v.shape, v.dtype) for v in init_disc],
      fusion_logit=tf.TensorSpec([], tf.float32),
      discrimination_loss=tf.TensorSpec([], tf.float32),
      num_participations=tf.TensorSpec([], tf.int32))
  # Which of E_G's tensors the client keeps (empty lists otherwise).
  keeps_statistics = local_statistics or keep_global_encoder
  kept_statistics = (initial_weights.non_trainable[:n_enc_nt]
                     if keeps_statistics else [])
  kept_encoder = (initial_weights.trainable[:n_enc]
                  if keep_global_encoder else [])
  state_type = tff.types.tensorflow_to_type(AFedCLClientState(
      **state_fields,
      global_statistics=[tf.TensorSpec(t.shape, t.dtype)
                         for t in kept_statistics],
      global_encoder=[tf.TensorSpec(t.shape, t.dtype)
                      for t in kept_encoder]))

  def assign_global_encoder(global_model, weights, state, *, evaluation):
    """Assigns E_G to `global_model`'s encoder: the broadcast one, with
    the client's own statistics once it has trained (`local_statistics`);
    for evaluation with `keep_global_encoder`, the client's kept E_G^t and
    the statistics it ran with once it has trained."""
    trainable = list(weights.trainable[:n_enc])
    statistics = list(weights.non_trainable[:n_enc_nt])
    own = client_works.own_statistics_once_trained
    if evaluation and keep_global_encoder:
      trainable = own(state.global_encoder, trainable,
                      state.num_participations)
    if local_statistics or (evaluation and keep_global_encoder):
      statistics = own(state.global_statistics, statistics,
                       state.num_participations)
    encoder = global_model.get_layer('encoder')
    for v, w in zip(encoder.trainable_weights, trainable):
      v.assign(w)
    for v, w in zip(encoder.non_trainable_weights, statistics):
      v.assign(w)

  @tf.function
  def client_update(local_model, global_model, disc, logit, global_weights,
                    state, dataset, round_num):
    start = process_lib._as_model_weights(state.model_weights)  # pylint: disable=protected-access
    model_spec_lib.assign_weights(local_model, start)
    assign_global_encoder(global_model, global_weights, state,
                          evaluation=False)
    for v, w in zip(disc.trainable_weights, state.discriminator):
      v.assign(w)
    logit.assign(state.fusion_logit)
    enc_l = local_model.get_layer('encoder')
    head = local_model.get_layer('head')
    enc_g = global_model.get_layer('encoder')
    learning_rate = client_works.decayed_learning_rate(
        client_optimizer, learning_rate_decay, round_num,
        disc.trainable_variables)

    # Stage 1: dynamic consensus construction (Eqs. 4-7). The carry sums
    # the discriminator's accuracy (Fig. 4(b)) over the batches it trains
    # on; it adds no gradient and does not change training.
    def dcc_forward(batch, correct):
      f_l = enc_l(batch['x'], training=True)
      f_g = tf.stop_gradient(enc_g(batch['x'], training=global_training))
      d_l = disc(keras_models.reverse_gradient(f_l, grl_weight))
      d_g = disc(f_g)
      n = tf.cast(tf.shape(batch['y'])[0], tf.float32)
      correct += tf.stop_gradient(
          fusion.discrimination_accuracy(d_l, d_g)) * n
      return (head(f_l, training=True), fusion.discrimination_loss(d_l, d_g),
              correct)

    stage1 = local_training.train_model(
        spec, local_model, client_optimizer, dataset, local_epochs,
        variables=(enc_l.trainable_variables + head.trainable_variables +
                   disc.trainable_variables),
        forward_fn=dcc_forward, learning_rate=learning_rate,
        carry=tf.constant(0.0))
    after_dcc = model_spec_lib.read_weights(local_model)
    ld = stage1['extra_sum'] / tf.maximum(stage1['num_examples'], 1.0)
    d_acc = stage1['carry'] / tf.maximum(stage1['num_examples'], 1.0)

    # Stage 2: adaptive feature fusion (Eqs. 9-11).
    if aff:
      def aff_forward(batch):
        f = fusion.fuse(enc_g(batch['x'], training=global_training),
                        enc_l(batch['x'], training=True), logit)
        return head(f, training=True), tf.constant(0.0)

      stage2 = local_training.train_model(
          spec, local_model, client_optimizer, dataset, local_epochs,
          variables=(enc_l.trainable_variables + head.trainable_variables +
                     [logit]),
          forward_fn=aff_forward, learning_rate=learning_rate)
      loss_sum = stage1['loss_sum'] + stage2['loss_sum']
      num = stage1['num_examples'] + stage2['num_examples']
    else:
      loss_sum, num = stage1['loss_sum'], stage1['num_examples']
    final = model_spec_lib.read_weights(local_model)
    new_disc = [tf.identity(v) for v in disc.trainable_variables]
    new_logit = tf.identity(logit)
    # E_G's statistics after both stages (they move only in training mode,
    # i.e. only with `local_statistics`; otherwise they are the server's)
    # and its (frozen) weights, E_G^t, where the client keeps them.
    new_global_statistics = ([tf.identity(v)
                              for v in enc_g.non_trainable_variables]
                             if keeps_statistics else [])
    new_global_encoder = ([tf.identity(v) for v in enc_g.trainable_variables]
                          if keep_global_encoder else [])
    finite = tf.logical_and(
        local_training.all_finite((final, new_disc, new_logit, after_dcc,
                                   new_global_statistics)),
        tf.logical_and(tf.math.is_finite(loss_sum), tf.math.is_finite(ld)))

    # Upload E_k after stage 1 (Algorithm 1, line 17) as a pseudo-gradient
    # from E_G; the classifier part of the delta is zero (never shared).
    delta = client_works.model_delta(global_weights, after_dcc)
    delta = ModelWeights(
        trainable=(list(delta.trainable[:n_enc]) +
                   [tf.zeros_like(t) for t in delta.trainable[n_enc:]]),
        non_trainable=list(delta.non_trainable))
    delta = local_training.select(finite, delta,
                                  client_works.zeros_like_weights(start))
    weight = weighted_aggregation.ScoreWeight(
        score=tf.where(finite, ld, 0.0),
        num_examples=tf.where(finite, stage1['num_examples'] /
                              float(local_epochs), 0.0))
    new_fields = dict(
        model_weights=local_training.select(finite, final, start),
        discriminator=local_training.select(finite, new_disc,
                                            list(state.discriminator)),
        fusion_logit=tf.where(finite, new_logit, state.fusion_logit),
        discrimination_loss=tf.where(finite, ld, state.discrimination_loss),
        num_participations=(state.num_participations +
                            tf.cast(finite, tf.int32)))
    new_state = AFedCLClientState(
        **new_fields,
        global_statistics=local_training.select(
            finite, new_global_statistics, list(state.global_statistics)),
        global_encoder=local_training.select(
            finite, new_global_encoder, list(state.global_encoder)))
    metrics = collections.OrderedDict(
        loss_sum=tf.where(finite, loss_sum, 0.0), num_examples=num,
        non_finite=1.0 - tf.cast(finite, tf.float32),
        discrimination_loss=tf.where(finite, ld, 0.0),
        discrimination_accuracy=tf.where(finite, d_acc, 0.0),
        # Per-client sums; the loop divides by the finite clients.
        fusion_weight=tf.where(finite, fusion.fusion_weight(new_logit), 0.0))
    return process_lib.ClientOutput(delta, weight, new_state, metrics)

  @tff.tensorflow.computation(broadcast_type, state_type, spec.data_type())
  def update(broadcast, state, dataset):
    local_model = spec.keras_model_fn()
    global_model = spec.keras_model_fn()
    disc = make_discriminator()
    logit = tf.Variable(0.0, dtype=tf.float32, name='fusion_logit')
    return client_update(
        local_model, global_model, disc, logit,
        process_lib._as_model_weights(broadcast.model_weights),  # pylint: disable=protected-access
        state, dataset, broadcast.round_num)

  @tf.function
  def fused_eval(local_model, global_model, global_weights, state, dataset):
    model_spec_lib.assign_weights(
        local_model, process_lib._as_model_weights(state.model_weights))  # pylint: disable=protected-access
    assign_global_encoder(global_model, global_weights, state,
                          evaluation=True)
    enc_l = local_model.get_layer('encoder')
    head = local_model.get_layer('head')
    enc_g = global_model.get_layer('encoder')

    def predict(x, training=False):
      if not aff:
        return head(enc_l(x, training=training), training=training)
      f = fusion.fuse(enc_g(x, training=False), enc_l(x, training=training),
                      state.fusion_logit)
      return head(f, training=training)

    return evaluation.evaluate_model(spec, predict, dataset)

  def personal_eval(global_weights, client_state, dataset):
    return fused_eval(spec.keras_model_fn(), spec.keras_model_fn(),
                      global_weights, client_state, dataset)

  def personal_features(global_weights, client_state, x):
    """Eager: the features C_k sees, A E_G(x) + (1 - A) E_k(x) (Eq. 9)."""
    local_model, global_model = spec.keras_model_fn(), spec.keras_model_fn()
    model_spec_lib.assign_weights(
        local_model, process_lib._as_model_weights(client_state.model_weights))  # pylint: disable=protected-access
    assign_global_encoder(global_model,
                          process_lib._as_model_weights(global_weights),  # pylint: disable=protected-access
                          client_state, evaluation=True)
    local = local_model.get_layer('encoder')(x, training=False)
    if not aff:
      return local
    return fusion.fuse(global_model.get_layer('encoder')(x, training=False),
                       local, client_state.fusion_logit)

  def initial_state(client_id: str) -> Any:
    del client_id
    fields = dict(
        model_weights=tf.nest.map_structure(np.copy, initial_weights),
        discriminator=[np.copy(v) for v in init_disc],
        fusion_logit=init_logit, discrimination_loss=np.float32(0.0),
        num_participations=np.int32(0))
    # The kept E_G tensors are never read before the first round
    # (num_participations == 0).
    return AFedCLClientState(
        **fields, global_statistics=[np.copy(t) for t in kept_statistics],
        global_encoder=[np.copy(t) for t in kept_encoder])

  work = process_lib.ClientWork(
      update=update, state_type=state_type, initial_state=initial_state,
      personal_eval=personal_eval, global_model_evaluable=False,
      personal_features=personal_features)
  return process_lib.compose_with_global_model(
      spec, initial_weights, work, server_optimizer=server_optimizer,
      aggregator_factory=aggregator,
      name='afedcl')
