"""FedLMD: label-masking distillation (Lu et al., ACM MM 2023).

FedNTD-style distillation from the frozen global model in which the
client's major labels are masked out of the teacher, so that the client
preserves the global knowledge of its minor labels (those it has few or no
examples of) and learns its major labels from its own data. Client k trains
a copy w of the global model w^t on

    L = CE(q_l, y) + beta * tau^2 * KL(p~_g^tau || q~_l^tau),

* q~_l^tau: softmax of the local logits / tau over the not-true classes
  (c != y);
* p~_g^tau: softmax of the global logits / tau over the not-true minor
  classes (c != y and c not major); major labels get probability 0,
* major labels of client k: the classes whose count in k's training data is
  above the mean count over ALL `spec.num_outputs` classes (absent classes
  count 0, so they are minor).

Checked against the authors' code (wnma3mz/FedLMD, src/algorithms/fedlmd):
`lmd_criterion` masks the major labels and the true label in the teacher's
softmax and only the true label in the student's (what `masked_kl` does
with `student_keep_mask`), and multiplies the KL by T^2; the server computes
the major labels as `counts > np.mean(counts)` over the full class-count
vector of the client (FedNTD's `data_map`). We compute the counts inside the
client update from the client's own dataset (one `dataset.reduce` over its
labels), so nothing about a client's labels leaves it.

Edge cases (documented behaviour, tested): when every class is equally
frequent there is no major label and FedLMD is exactly FedNTD with the same
beta and tau. An example whose true label is the client's only minor label
has no class left in the teacher; its distillation term is 0 (the authors'
-1000 logit offsets would instead distil the teacher's full softmax there,
an artefact of shifting every logit by the same constant). beta = 0 is
FedAvg.

Defaults from the authors' config (src/config/fedlmd.json, and the
`LMD_Loss` class defaults): tau = 1, beta = 1. Metrics add
`num_major_labels` (per client) and `distillation_loss`.
"""

import collections
from typing import Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_pfl.algorithms import fedntd
from tff_pfl.core import model_spec as model_spec_lib
from tff_pfl.core import process as process_lib
from tff_pfl.templates import client_works
from tff_pfl.templates import distillation

ModelWeights = tff.learning.models.ModelWeights


def major_label_mask(counts: tf.Tensor) -> tf.Tensor:
  """bool [classes]: counts above their mean over all classes."""
  counts = tf.cast(counts, tf.float32)
  return counts > tf.reduce_mean(counts)


def lmd_loss(labels: tf.Tensor, student_logits: tf.Tensor,
             teacher_logits: tf.Tensor, major: tf.Tensor, *, beta: float,
             temperature: float) -> tf.Tensor:
  """beta * tau^2 * KL(p~_g || q~_l) with the major labels masked out of p~_g.

  Args:
    labels: [batch] true classes.
    student_logits: [batch, classes] local logits.
    teacher_logits: [batch, classes] global logits.
    major: bool [classes], the client's major labels.
    beta: weight.
    temperature: tau.
  """
  not_true = distillation.not_true_mask(labels, tf.shape(student_logits)[-1])
  teacher_keep = tf.logical_and(not_true,
                                tf.logical_not(major)[tf.newaxis, :])
  return beta * temperature**2 * distillation.masked_kl(
      teacher_logits, student_logits, teacher_keep, temperature,
      student_keep_mask=not_true)


def build_fedlmd(
    spec: model_spec_lib.ModelSpec,
    *,
    initial_weights: ModelWeights,
    client_optimizer: tff.learning.optimizers.Optimizer,
    server_optimizer: Optional[tff.learning.optimizers.Optimizer] = None,
    local_epochs: int = 1,
    learning_rate_decay: float = 1.0,
    beta: float = 1.0,
    temperature: float = 1.0,
) -> process_lib.PersonalizedProcess:
  """Builds FedLMD; see the module docstring.

  Args:
    spec: classification model spec (classes: `spec.num_outputs`).
    initial_weights: seeded initial global weights.
    client_optimizer: TFF optimizer for local training.
    server_optimizer: applied to the averaged delta; default SGD at 1.0.
    local_epochs: local epochs E.
    learning_rate_decay: per-round client learning-rate decay.
    beta: weight of the label-masking distillation term, >= 0 (0 is FedAvg).
    temperature: softmax temperature tau > 0.
  """
  fedntd.check_distillation_hparams('FedLMD', beta, temperature)
  beta, temperature = float(beta), float(temperature)
  num_classes = spec.num_outputs

  def client_info(dataset):
    major = major_label_mask(client_works.label_counts(dataset, num_classes))
    return major, collections.OrderedDict(
        num_major_labels=tf.reduce_sum(tf.cast(major, tf.float32)))

  def distill(labels, student_logits, teacher_logits, major):
    return lmd_loss(labels, student_logits, teacher_logits, major, beta=beta,
                    temperature=temperature)

  work = fedntd.build_global_teacher_client_work(
      spec, client_optimizer, local_epochs=local_epochs,
      learning_rate_decay=learning_rate_decay, distillation_fn=distill,
      client_info_fn=client_info)
  return process_lib.compose_with_global_model(
      spec, initial_weights, work, server_optimizer=server_optimizer,
      name='fedlmd')
