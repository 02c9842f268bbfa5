"""Knowledge-distillation losses shared by the distillation-based methods.

All functions take logits (never probabilities) for the student, so that
log-softmax is computed stably, and return the batch mean of a per-example
loss as a float32 scalar.

* `soft_target_kl(teacher_probs, student_logits)`: KL(H || softmax(z)) for a
  given target distribution H (FedPSD's fused soft labels, Eqs. 3-4), with
  0 * log 0 = 0 so one-hot or partly-zero targets are fine.
* `masked_kl(teacher_logits, student_logits, keep_mask, temperature,
  student_keep_mask=None)`: KL(q~_t || q~_s) between temperature softmaxes
  restricted to the kept classes (FedLMD's label-masking distillation).
* `not_true_kl(teacher_logits, student_logits, labels, temperature)`: the
  same with every class but the true one kept (FedNTD's not-true
  distillation).

Masked classes are excluded from the softmaxes exactly: their logits are
replaced by a large finite negative number (never -inf, so nothing becomes
NaN), their teacher probability is exactly 0 and their terms are dropped. A
row whose teacher keeps no class contributes 0. These two losses are the
plain KL of the tempered softmaxes; the Hinton factor tau^2 is the caller's
choice (FedNTD and FedLMD apply it, see their modules). The teacher is
treated as a constant (`tf.stop_gradient`).
"""

from typing import Optional

import tensorflow as tf

# Stands in for -inf on masked logits: exp(_MASKED_LOGIT - max) underflows to
# exactly 0 in float32 while every value stays finite.
_MASKED_LOGIT = -1e9


def soft_target_kl(teacher_probs: tf.Tensor,
                   student_logits: tf.Tensor) -> tf.Tensor:
  """Batch mean of KL(teacher || softmax(student_logits)).

  Args:
    teacher_probs: [batch, classes] target distributions (rows sum to 1).
    student_logits: [batch, classes] student logits.

  Returns:
    Scalar float32; entries where the teacher is 0 contribute 0.
  """
  teacher = tf.cast(teacher_probs, tf.float32)
  log_student = tf.nn.log_softmax(tf.cast(student_logits, tf.float32))
  safe_log_teacher = tf.math.log(tf.where(teacher > 0, teacher, 1.0))
  per_example = tf.reduce_sum(
      tf.where(teacher > 0, teacher * (safe_log_teacher - log_student), 0.0),
      axis=-1)
  return tf.reduce_mean(per_example)


def _check_temperature(temperature: float) -> None:
  if not temperature > 0:
    raise ValueError(f'distillation temperature must be > 0, got '
                     f'{temperature}.')


def masked_kl(teacher_logits: tf.Tensor,
              student_logits: tf.Tensor,
              keep_mask: tf.Tensor,
              temperature: float,
              student_keep_mask: Optional[tf.Tensor] = None) -> tf.Tensor:
  """Batch mean of KL(q~_t || q~_s) over the kept classes.

  q~_t = softmax over the teacher-kept classes of teacher_logits / T, and
  q~_s = softmax over the student-kept classes of student_logits / T; the
  other classes get probability 0 and are left out of the sum:

      KL_i = sum_{c kept by the teacher} q~_t(c) (log q~_t(c) - log q~_s(c)).

  Args:
    teacher_logits: [batch, classes] teacher logits (no gradient flows).
    student_logits: [batch, classes] student logits.
    keep_mask: bool, [batch, classes] or [classes] (broadcast over the
      batch): the classes kept in both softmaxes.
    temperature: T > 0 (a Python number).
    student_keep_mask: optional bool mask, same shapes, for a student softmax
      over more classes than the teacher's (FedLMD masks the major labels in
      the teacher only); the teacher then keeps `keep_mask AND
      student_keep_mask`. Default: `keep_mask`.

  Returns:
    Scalar float32: the mean over the batch of KL_i, where a row whose
    teacher keeps no class contributes 0 (it still counts in the mean).
  """
  _check_temperature(temperature)
  student = tf.cast(student_logits, tf.float32) / temperature
  teacher = tf.stop_gradient(tf.cast(teacher_logits, tf.float32)) / temperature
  shape = tf.shape(student)
  keep = tf.broadcast_to(tf.cast(keep_mask, tf.bool), shape)
  if student_keep_mask is None:
    student_keep = keep
  else:
    student_keep = tf.broadcast_to(tf.cast(student_keep_mask, tf.bool), shape)
  teacher_keep = tf.logical_and(keep, student_keep)
  log_t = tf.nn.log_softmax(tf.where(teacher_keep, teacher, _MASKED_LOGIT),
                            axis=-1)
  log_s = tf.nn.log_softmax(tf.where(student_keep, student, _MASKED_LOGIT),
                            axis=-1)
  terms = tf.where(teacher_keep, tf.exp(log_t) * (log_t - log_s), 0.0)
  return tf.reduce_mean(tf.reduce_sum(terms, axis=-1))


def not_true_mask(labels: tf.Tensor, num_classes: tf.Tensor) -> tf.Tensor:
  """[batch, classes] bool: True everywhere except at each row's label."""
  labels = tf.cast(tf.reshape(labels, [-1, 1]), tf.int32)
  return tf.not_equal(tf.range(num_classes, dtype=tf.int32)[tf.newaxis, :],
                      labels)


def not_true_kl(teacher_logits: tf.Tensor,
                student_logits: tf.Tensor,
                labels: tf.Tensor,
                temperature: float) -> tf.Tensor:
  """Batch mean of KL(q~_t || q~_s) over the not-true classes (FedNTD).

  q~ are the softmaxes of logits / T with each example's true class removed
  (Lee et al., NeurIPS 2022), so the true-class logits do not affect the
  value.

  Args:
    teacher_logits: [batch, classes] teacher (global model) logits.
    student_logits: [batch, classes] student (local model) logits.
    labels: [batch] (or [batch, 1]) integer true classes.
    temperature: T > 0.
  """
  keep = not_true_mask(labels, tf.shape(student_logits)[-1])
  return masked_kl(teacher_logits, student_logits, keep, temperature)
