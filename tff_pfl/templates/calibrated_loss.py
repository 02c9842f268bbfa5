"""Logit-calibrated cross-entropy (FedPSD, fedpsd.txt Section IV-C, Eqs. 5-8).

A client whose label prior P(y) is skewed learns logits biased towards its
frequent classes. FedPSD trains with the prior added to the logits,

    P_cal(y | x) = P(y) e^{f_y(x)} / sum_{y'} P(y') e^{f_{y'}(x)}      (Eq. 7)
    L_CE(f(x), y) = -log P_cal(y | x)                                   (Eq. 8)

i.e. softmax cross-entropy on `f(x) + ln P(y)`, so that the raw logits f
approximate the balanced `f_y(x) - ln P(y)` objective of Eq. 6 and keep the
knowledge of classes the client rarely sees.

Classes absent from the client have P(y') = 0: in Eq. 7 their terms vanish
from the denominator. Adding ln 0 = -inf would give NaN gradients, so they
are masked instead: their calibrated logit is a large finite negative
number, whose softmax weight (and gradient) is exactly 0 in float32. A
sample's own label is always present (it was counted), so the loss is
finite.
"""

import tensorflow as tf

# exp(MASKED_LOGIT - anything reasonable) underflows to exactly 0.0.
MASKED_LOGIT = -1e9


def calibrate_logits(logits: tf.Tensor, counts: tf.Tensor) -> tf.Tensor:
  """`logits + ln P(y)` with P from `counts`; absent classes masked."""
  counts = tf.cast(counts, logits.dtype)
  present = counts > 0
  prior = counts / tf.maximum(tf.reduce_sum(counts), 1.0)
  log_prior = tf.math.log(tf.where(present, prior, 1.0))
  return tf.where(present[tf.newaxis, :], logits + log_prior[tf.newaxis, :],
                  tf.cast(MASKED_LOGIT, logits.dtype))


def calibrated_cross_entropy(labels: tf.Tensor, logits: tf.Tensor,
                             counts: tf.Tensor) -> tf.Tensor:
  """Batch mean of Eq. 8, the cross-entropy of the calibrated probabilities.

  Args:
    labels: int [batch] class indices (each must have a positive count).
    logits: float [batch, classes] model logits f(x).
    counts: float [classes] the client's label counts (its prior P(y)).
  """
  return tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(
      labels, calibrate_logits(logits, counts), from_logits=True))
