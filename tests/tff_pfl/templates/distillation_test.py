"""Tests for tff_pfl.templates.distillation (masked and not-true KL)."""

import numpy as np
import pytest
import tensorflow as tf

from tff_pfl.templates import distillation


def _np_log_softmax(z):
  z = z - z.max(axis=-1, keepdims=True)
  return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def _np_masked_kl(teacher, student, keep, temperature, student_keep=None):
  """Reference: per-row KL over the kept classes, rows without any -> 0."""
  teacher = np.asarray(teacher, np.float64) / temperature
  student = np.asarray(student, np.float64) / temperature
  keep = np.broadcast_to(keep, teacher.shape)
  student_keep = keep if student_keep is None else np.broadcast_to(
      student_keep, teacher.shape)
  teacher_keep = keep & student_keep
  out = []
  for t, s, kt, ks in zip(teacher, student, teacher_keep, student_keep):
    if not kt.any():
      out.append(0.0)
      continue
    log_t = _np_log_softmax(t[kt])
    log_s_all = _np_log_softmax(s[ks])
    log_s = dict(zip(np.flatnonzero(ks), log_s_all))
    out.append(sum(np.exp(lt) * (lt - log_s[c])
                   for lt, c in zip(log_t, np.flatnonzero(kt))))
  return float(np.mean(out))


def _np_not_true_kl(teacher, student, labels, temperature):
  keep = np.arange(teacher.shape[1])[None, :] != np.asarray(labels)[:, None]
  return _np_masked_kl(teacher, student, keep, temperature)


RNG = np.random.default_rng(0)
TEACHER = RNG.normal(size=(6, 5)).astype(np.float32) * 2
STUDENT = RNG.normal(size=(6, 5)).astype(np.float32) * 2
LABELS = np.array([0, 1, 2, 3, 4, 0])


@pytest.mark.parametrize('temperature', [0.5, 1.0, 3.0])
def test_not_true_kl_matches_numpy(temperature):
  got = distillation.not_true_kl(TEACHER, STUDENT, LABELS, temperature)
  want = _np_not_true_kl(TEACHER, STUDENT, LABELS, temperature)
  assert float(got) == pytest.approx(want, rel=1e-5, abs=1e-7)
  assert want > 0


def test_not_true_kl_is_zero_for_equal_models_and_ignores_true_logit():
  assert float(distillation.not_true_kl(TEACHER, TEACHER, LABELS, 1.0)) == (
      pytest.approx(0.0, abs=1e-6))
  # Only the true-class logits differ: still 0.
  student = TEACHER.copy()
  student[np.arange(6), LABELS] += np.linspace(-5, 5, 6).astype(np.float32)
  assert float(distillation.not_true_kl(TEACHER, student, LABELS, 1.0)) == (
      pytest.approx(0.0, abs=1e-6))
  # Changing the true logits of either model does not change the value, and
  # the gradient w.r.t. the student's true logits is exactly 0.
  teacher = TEACHER.copy()
  teacher[np.arange(6), LABELS] = 100.0
  base = float(distillation.not_true_kl(TEACHER, STUDENT, LABELS, 2.0))
  assert float(distillation.not_true_kl(teacher, STUDENT, LABELS, 2.0)) == (
      pytest.approx(base, rel=1e-6))
  logits = tf.Variable(STUDENT)
  with tf.GradientTape() as tape:
    loss = distillation.not_true_kl(TEACHER, logits, LABELS, 2.0)
  grad = tape.gradient(loss, logits).numpy()
  assert np.all(grad[np.arange(6), LABELS] == 0.0)
  assert np.abs(grad).sum() > 0
  # Labels as [batch, 1] work too.
  assert float(distillation.not_true_kl(
      TEACHER, STUDENT, LABELS[:, None], 2.0)) == pytest.approx(base)


@pytest.mark.parametrize('temperature', [0.5, 2.0])
def test_masked_kl_matches_numpy_for_random_masks(temperature):
  keep = RNG.random((6, 5)) < 0.6
  keep[0] = False                  # nothing kept: contributes 0
  keep[1] = [False, False, True, False, False]   # a single class kept
  got = distillation.masked_kl(TEACHER, STUDENT, keep, temperature)
  want = _np_masked_kl(TEACHER, STUDENT, keep, temperature)
  assert float(got) == pytest.approx(want, rel=1e-5, abs=1e-7)


def test_masked_kl_single_kept_class_and_empty_rows_are_finite():
  keep = np.zeros((2, 4), bool)
  keep[0, 2] = True                # everything but one class masked
  logits = tf.Variable(np.array([[1e4, -3.0, 0.5, 2.0],
                                 [5.0, 1.0, -1.0, 0.0]], np.float32))
  with tf.GradientTape() as tape:
    loss = distillation.masked_kl(logits * 0.5, logits, keep, 1.0)
  # Same single class in both softmaxes: both are one-hot, KL = 0.
  assert float(loss) == 0.0
  grad = tape.gradient(loss, logits)
  assert np.all(np.isfinite(grad.numpy()))
  # The student keeps more classes than the teacher: KL = -log q_s(kept).
  student_keep = np.ones((2, 4), bool)
  student = np.array([[0.0, 1.0, 2.0, 3.0], [0.0, 0.0, 0.0, 0.0]],
                     np.float32)
  got = distillation.masked_kl(student, student, keep, 1.0,
                               student_keep_mask=student_keep)
  want = -_np_log_softmax(student[0].astype(np.float64))[2] / 2  # row 1: 0
  assert float(got) == pytest.approx(want, rel=1e-5)
  assert float(got) == pytest.approx(_np_masked_kl(
      student, student, keep, 1.0, student_keep), rel=1e-5)


def test_masked_kl_with_class_mask_and_student_mask_matches_numpy():
  minor = np.array([True, False, True, True, False])       # [classes] mask
  not_true = np.arange(5)[None, :] != LABELS[:, None]
  got = distillation.masked_kl(TEACHER, STUDENT, not_true & minor, 1.5,
                               student_keep_mask=not_true)
  want = _np_masked_kl(TEACHER, STUDENT, not_true & minor, 1.5, not_true)
  assert float(got) == pytest.approx(want, rel=1e-5)
  # A [classes] keep mask broadcasts over the batch.
  got = distillation.masked_kl(TEACHER, STUDENT, minor, 1.0)
  assert float(got) == pytest.approx(
      _np_masked_kl(TEACHER, STUDENT, minor[None, :], 1.0), rel=1e-5)
  # Masked teacher classes never get gradient-free NaNs, even huge logits.
  teacher = TEACHER.copy()
  teacher[:, 1] = 1e6
  assert np.isfinite(float(distillation.masked_kl(
      teacher, STUDENT, minor, 1.0)))


def test_bad_temperature():
  with pytest.raises(ValueError, match='temperature'):
    distillation.not_true_kl(TEACHER, STUDENT, LABELS, 0.0)
  with pytest.raises(ValueError, match='temperature'):
    distillation.masked_kl(TEACHER, STUDENT, np.ones(5, bool), -1.0)
