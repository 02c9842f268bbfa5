"""FedPSD: progressive self-distillation with logit calibration (fedpsd.txt).

The server side is FedAvg's; everything new happens in local training
(Section IV, Fig. 1). In round t a sampled client k starts from the global
model w_g^t and trains E epochs on

    L_local = L_CE + L_KD                                            (Eq. 9)

* L_CE, logit-calibrated cross-entropy (CLL, Eqs. 7-8): softmax
  cross-entropy on f(x) + ln P_k(y), P_k the client's own label prior
  (`templates.calibrated_loss`; absent classes are masked, not -inf).
* L_KD = KL(H || P^{t,e}) (Eq. 4), P^{t,e} = softmax(f(x)) of the model
  being trained, against a fused soft label H:
  - epoch e = 1, reviewing historical personalized knowledge (RHPK,
    Eqs. 1-2): H_k^{t-1} = alpha P_k^{t-1} + (1 - alpha) Y_k, where P_k^{t-1}
    are the client's stored per-sample predictions from its last
    participation and Y_k the one-hot labels; a client seen for the first
    time has no P_k^{t-1} and uses H = Y_k, Eq. 1 without its history
    term. That is also Eq. 1's limit as alpha -> 0, the early rounds in
    which most clients first take part (alpha = t / t_total), so a client's
    epoch-1 target does not jump between its first and second
    participation. (Dropping L_KD from the first epoch would be the other
    reading; the paper does not say.)
  - epochs e >= 2, progressive self-distillation (PSD, Eq. 3):
    H_k^{t,e-1} = alpha P_k^{t,e-1} + (1 - alpha) Y_k from the model's own
    predictions of each sample during epoch e - 1;
  - alpha = t / t_total (Eq. 2) with t the 1-based round and t_total the
    planned number of rounds (`total_rounds`, from the run).

Per-sample predictions are kept as in progressive self-knowledge
distillation: each sample's softmax output is recorded (without gradient)
when it is trained on, in a buffer indexed by the sample's position in the
client's split (the dataset's `index`, see `client_data.with_index`), so
shuffling and augmentation are allowed. The buffer of the last local epoch
becomes the client's stored P_k^t: each sample's softmax as the model saw
it while training on it in the last epoch (training mode, on the augmented
input, just before the step on its batch), not a separate inference pass of
the final model. The paper allows both readings (Eq. 1: the personalized
model's output "after local training"; Section VII: "the personalized model
outputs generated during local training"); this one costs no extra pass
and is the one PSD's epoch-to-epoch teacher (Eq. 3) uses, so that epoch 1
and epochs >= 2 distil the same kind of target (checked against an eager
reference in the tests).

Client state: the stored predictions (float32 [n_k, classes]; use the disk
store for many clients), the personalized model (the locally trained
weights, which is what the paper evaluates per client before aggregation,
Eq. 10) and a participation count. A client never sampled is evaluated
with the global model.

Switches reproduce the ablation of Table VI: `rhpk` (the epoch-1 KD term),
`psd` (the epoch >= 2 KD terms), `cll` (calibrated instead of plain CE).
All three off is FedAvg (tested).
"""

import collections
from typing import Any, NamedTuple, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_pfl.core import model_spec as model_spec_lib
from tff_pfl.core import process as process_lib
from tff_pfl.templates import calibrated_loss
from tff_pfl.templates import client_works
from tff_pfl.templates import distillation
from tff_pfl.templates import local_training


class FedPSDClientState(NamedTuple):
  """What a FedPSD client keeps between its participations."""
  predictions: Any            # float32 [n_k, classes], P_k^{t-1}; [0, C] if new
  personal_weights: Any       # ModelWeights after the last local training
  num_participations: Any     # int32


def fused_label(teacher_probs: tf.Tensor, labels: tf.Tensor, alpha: tf.Tensor,
                num_classes: int) -> tf.Tensor:
  """H = alpha * P + (1 - alpha) * Y (Eqs. 1 and 3), Y one-hot."""
  one_hot = tf.one_hot(tf.cast(labels, tf.int32), num_classes)
  return alpha * teacher_probs + (1.0 - alpha) * one_hot


def build_fedpsd(
    spec: model_spec_lib.ModelSpec,
    *,
    initial_weights: tff.learning.models.ModelWeights,
    client_optimizer: tff.learning.optimizers.Optimizer,
    server_optimizer: Optional[tff.learning.optimizers.Optimizer] = None,
    local_epochs: int = 5,
    learning_rate_decay: float = 1.0,
    total_rounds: Optional[int] = None,
    rhpk: bool = True,
    psd: bool = True,
    cll: bool = True,
) -> process_lib.PersonalizedProcess:
  """Builds FedPSD.

  Args:
    spec: a classification spec whose datasets carry `index`.
    initial_weights: seeded initial global weights.
    client_optimizer: local optimizer (paper: SGD lr 0.01, momentum 0.9,
      weight decay 1e-5, decayed x0.99 per round).
    server_optimizer: applies the averaged delta; default plain averaging.
    local_epochs: E (paper: 5). PSD needs E >= 2 to act.
    learning_rate_decay: per-round client learning-rate decay.
    total_rounds: t_total of Eq. 2 (the run's planned rounds; passed by the
      registry's `run_context`). Required.
    rhpk: reviewing historical personalized knowledge (epoch-1 KD term).
    psd: progressive self-distillation (epoch >= 2 KD terms).
    cll: calibrated-logit cross-entropy instead of plain cross-entropy.
  """
  if spec.task != 'classification':
    raise ValueError('FedPSD needs a classification task, got '
                     f'{spec.task!r}.')
  if not spec.has_index:
    raise ValueError('FedPSD stores per-sample predictions: the spec\'s '
                     'input_spec needs an `index` entry (build client '
                     'datasets with tff_pfl.data.client_data.with_index).')
  if total_rounds is None or total_rounds < 1:
    raise ValueError('FedPSD needs total_rounds >= 1 (t_total of Eq. 2), got '
                     f'{total_rounds!r}.')
  if local_epochs < 1:
    raise ValueError(f'local epochs must be >= 1, got {local_epochs}.')
  num_classes = spec.num_outputs
  weights_type = spec.weights_type()
  broadcast_type = process_lib.broadcast_type(weights_type)
  state_type = tff.types.tensorflow_to_type(FedPSDClientState(
      predictions=tf.TensorSpec([None, num_classes], tf.float32),
      personal_weights=weights_type,
      num_participations=tf.TensorSpec([], tf.int32)))

  @tf.function
  def train(model, start_weights, dataset, round_num, history, seen):
    model_spec_lib.assign_weights(model, start_weights)
    counts = client_works.label_counts(dataset, num_classes)
    num_samples = tf.cast(tf.reduce_sum(counts), tf.int32)
    alpha = tf.minimum(
        tf.cast(round_num + 1, tf.float32) / float(total_rounds), 1.0)
    has_history = tf.logical_and(
        seen, tf.equal(tf.shape(history)[0], num_samples))
    empty = tf.zeros([num_samples, num_classes], tf.float32)
    # Epoch 1's teacher: stored predictions (weight alpha) or labels alone.
    teacher = tf.cond(has_history, lambda: history, lambda: empty)
    teacher_alpha = tf.where(has_history, alpha, 0.0)
    kd_weight = tf.constant(1.0 if rhpk else 0.0)

    if cll:
      task_loss_fn = lambda y, logits: calibrated_loss.calibrated_cross_entropy(  # pylint: disable=g-long-lambda
          y, logits, counts)
    else:
      task_loss_fn = spec.loss

    def forward(batch, carry):
      teacher, current, teacher_alpha, kd_weight = carry
      index = tf.cast(batch['index'], tf.int32)
      tf.debugging.assert_less(
          index, num_samples,
          message='FedPSD: a sample index is out of range of the client\'s '
                  'split; datasets must carry positions from with_index.')
      logits = model(batch['x'], training=True)
      h = fused_label(tf.gather(teacher, index), batch['y'], teacher_alpha,
                      num_classes)
      kd = kd_weight * distillation.soft_target_kl(h, logits)
      current = tf.tensor_scatter_nd_update(
          current, index[:, tf.newaxis],
          tf.stop_gradient(tf.nn.softmax(logits)))
      return logits, kd, (teacher, current, teacher_alpha, kd_weight)

    def epoch_end(carry):
      _, current, _, _ = carry
      # The epoch's predictions teach the next epoch (Eq. 3).
      return (current, current, alpha, tf.constant(1.0 if psd else 0.0))

    learning_rate = client_works.decayed_learning_rate(
        client_optimizer, learning_rate_decay, round_num,
        model.trainable_variables)
    sums = local_training.train_model(
        spec, model, client_optimizer, dataset, local_epochs,
        variables=model.trainable_variables, forward_fn=forward,
        task_loss_fn=task_loss_fn, learning_rate=learning_rate,
        carry=(teacher, empty, teacher_alpha, kd_weight),
        epoch_end_fn=epoch_end)
    weights = model_spec_lib.read_weights(model)
    # After epoch_end the carry's teacher is the last epoch's predictions.
    predictions = sums['carry'][0]
    loss = sums['loss_sum'] + sums['extra_sum']
    finite = tf.logical_and(local_training.all_finite(weights),
                            tf.math.is_finite(loss))
    return weights, predictions, sums, finite

  @tff.tensorflow.computation(broadcast_type, state_type, spec.data_type())
  def update(broadcast, state, dataset):
    model = spec.keras_model_fn()
    start = process_lib._as_model_weights(broadcast.model_weights)  # pylint: disable=protected-access
    weights, predictions, sums, finite = train(
        model, start, dataset, broadcast.round_num, state.predictions,
        state.num_participations > 0)
    delta = local_training.select(
        finite, client_works.model_delta(start, weights),
        client_works.zeros_like_weights(start))
    new_personal = local_training.select(
        finite, weights,
        process_lib._as_model_weights(state.personal_weights))  # pylint: disable=protected-access
    new_predictions = tf.cond(finite, lambda: predictions,
                              lambda: state.predictions)
    metrics = collections.OrderedDict(
        loss_sum=tf.where(finite, sums['loss_sum'], 0.0),
        kd_loss_sum=tf.where(finite, sums['extra_sum'], 0.0),
        num_examples=sums['num_examples'],
        non_finite=1.0 - tf.cast(finite, tf.float32))
    weight = tf.where(finite, sums['num_examples'], 0.0)
    new_state = FedPSDClientState(
        predictions=new_predictions, personal_weights=new_personal,
        num_participations=(state.num_participations +
                            tf.cast(finite, tf.int32)))
    return process_lib.ClientOutput(
        delta, weight, new_state, metrics,
        local_model=local_training.select(finite, weights, start))

  def initial_state(client_id: str) -> FedPSDClientState:
    del client_id
    return FedPSDClientState(
        predictions=np.zeros((0, num_classes), np.float32),
        personal_weights=tf.nest.map_structure(np.copy, initial_weights),
        num_participations=np.int32(0))

  def personal_weights(global_weights, client_state):
    return local_training.select(
        client_state.num_participations > 0,
        process_lib._as_model_weights(client_state.personal_weights),  # pylint: disable=protected-access
        process_lib._as_model_weights(global_weights))  # pylint: disable=protected-access

  work = process_lib.ClientWork(update=update, state_type=state_type,
                                initial_state=initial_state,
                                personal_weights=personal_weights)
  return process_lib.compose_with_global_model(
      spec, initial_weights, work, server_optimizer=server_optimizer,
      name='fedpsd')
