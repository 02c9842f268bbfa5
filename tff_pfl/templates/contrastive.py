"""MOON's model-contrastive loss (Li, He and Song, CVPR 2021, Section 3).

For a local representation z of an input, the representation z_glob of the
same input under the (frozen) global model and z_prev under the client's
(frozen) local model of its previous round,

    l_con = -log( exp(sim(z, z_glob)/tau)
                  / (exp(sim(z, z_glob)/tau) + exp(sim(z, z_prev)/tau)) )
          = softplus( (sim(z, z_prev) - sim(z, z_glob)) / tau ),

with sim the cosine similarity: it pulls z towards the global model's
representation and pushes it away from the previous local one. This is the
cross-entropy of the two-logit vector [sim(z, z_glob), sim(z, z_prev)] / tau
with target 0, as the authors' code computes it (QinbinLi/MOON, main.py,
`train_net_fedcon`, model buffer size 1). When z_glob == z_prev the loss is
log 2 whatever z is, and its gradient is 0.
"""

import tensorflow as tf


def cosine_similarity(a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
  """Row-wise cosine similarity of [batch, ...] tensors, flattened per row.

  Zero rows have similarity 0 (L2 normalisation with a tiny epsilon, like
  PyTorch's `CosineSimilarity(eps=1e-8)`), so nothing becomes NaN.
  """
  a = tf.reshape(tf.cast(a, tf.float32), [tf.shape(a)[0], -1])
  b = tf.reshape(tf.cast(b, tf.float32), [tf.shape(b)[0], -1])
  return tf.reduce_sum(tf.math.l2_normalize(a, axis=-1, epsilon=1e-12) *
                       tf.math.l2_normalize(b, axis=-1, epsilon=1e-12),
                       axis=-1)


def model_contrastive_loss(z: tf.Tensor, z_global: tf.Tensor,
                           z_previous: tf.Tensor,
                           temperature: float) -> tf.Tensor:
  """Batch mean of MOON's l_con (see the module docstring).

  Args:
    z: [batch, ...] representations of the model being trained.
    z_global: the global model's representations (no gradient flows).
    z_previous: the previous local model's representations (no gradient).
    temperature: tau > 0 (a Python number).

  Returns:
    Scalar float32.
  """
  if not temperature > 0:
    raise ValueError(f'contrastive temperature must be > 0, got '
                     f'{temperature}.')
  positive = cosine_similarity(z, tf.stop_gradient(z_global)) / temperature
  negative = cosine_similarity(z, tf.stop_gradient(z_previous)) / temperature
  return tf.reduce_mean(tf.nn.softplus(negative - positive))
