"""Adaptive feature fusion (AFedCL Eq. 9) and the discriminator loss (Eq. 5).

The fusion weight A_k in [0, 1] is kept as an unconstrained logit a_k with
A_k = sigmoid(a_k), so gradient steps on a_k can never leave [0, 1]; a_k = 0
(A_k = 0.5, an even mix of global and local features) is the initial value.
"""

import tensorflow as tf


def fusion_weight(logit: tf.Tensor) -> tf.Tensor:
  """A = sigmoid(a), the weight of the global features."""
  return tf.sigmoid(logit)


def fuse(global_features: tf.Tensor, local_features: tf.Tensor,
         logit: tf.Tensor) -> tf.Tensor:
  """f = A * E_G(x) + (1 - A) * E_k(x)  (Eq. 9)."""
  a = fusion_weight(logit)
  return a * global_features + (1.0 - a) * local_features


def discrimination_loss(local_logits: tf.Tensor,
                        global_logits: tf.Tensor) -> tf.Tensor:
  """L_D of Eq. 5: binary cross-entropy, local features labelled 0, global
  features labelled 1, averaged over the 2|S| features."""
  bce = tf.nn.sigmoid_cross_entropy_with_logits
  local = bce(labels=tf.zeros_like(local_logits), logits=local_logits)
  glob = bce(labels=tf.ones_like(global_logits), logits=global_logits)
  return 0.5 * (tf.reduce_mean(local) + tf.reduce_mean(glob))


def discrimination_accuracy(local_logits: tf.Tensor,
                            global_logits: tf.Tensor) -> tf.Tensor:
  """The discriminator's accuracy over the 2|S| features of Eq. 5 (the
  paper's Fig. 4(b)): a local feature is right when D says "local" (logit
  < 0), a global one when D says "global" (logit > 0); 0.5 is chance."""
  right_local = tf.cast(local_logits < 0.0, tf.float32)
  right_global = tf.cast(global_logits > 0.0, tf.float32)
  return 0.5 * (tf.reduce_mean(right_local) + tf.reduce_mean(right_global))
