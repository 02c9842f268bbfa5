"""Tests for keras_models.resnet (ResNet-10/18 BasicBlock encoders)."""

from collections.abc import Sequence

import pytest
import tensorflow as tf

from keras_models import registry
from keras_models import resnet


def _expected_counts(
    blocks: Sequence[int],
    in_channels: int = 3,
    small_input: bool = True,
    widths: Sequence[int] = (64, 128, 256, 512),
) -> tuple[int, int]:
  """Returns (trainable, total) parameters of a BasicBlock ResNet body.

  Computed from the layer shapes, independently of the Keras model:
  convolutions have no bias; every batch norm has trainable gamma and beta
  plus non-trainable moving mean and variance (PyTorch counts only gamma and
  beta as parameters, so PyTorch's count equals our *trainable* count).
  """
  stem_kernel = 3 if small_input else 7
  trainable = stem_kernel * stem_kernel * in_channels * widths[0]
  bn_channels = widths[0]
  in_c = widths[0]
  for stage, (num_blocks, out_c) in enumerate(zip(blocks, widths)):
    for block in range(num_blocks):
      stride = 2 if stage > 0 and block == 0 else 1
      trainable += 3 * 3 * in_c * out_c + 3 * 3 * out_c * out_c
      bn_channels += 2 * out_c
      if stride != 1 or in_c != out_c:
        trainable += in_c * out_c  # 1x1 projection shortcut
        bn_channels += out_c
      in_c = out_c
  trainable += 2 * bn_channels
  return trainable, trainable + 2 * bn_channels


def _trainable_count(model: tf.keras.Model) -> int:
  return sum(int(tf.size(v)) for v in model.trainable_variables)


def test_resnet18_cifar_parameter_count():
  model = resnet.build_resnet18((32, 32, 3))
  trainable, total = _expected_counts((2, 2, 2, 2))
  # The common PyTorch CIFAR ResNet-18 (kuangliu/pytorch-cifar) has
  # 11,173,962 parameters with its 10-class fc layer (512 * 10 + 10 = 5,130),
  # i.e. 11,168,832 for the body; our layer-shape computation agrees.
  assert trainable == 11_168_832
  assert _trainable_count(model) == trainable
  assert model.count_params() == total == 11_168_832 + 2 * 4_800
  full = registry.build_model('resnet18', (32, 32, 3), 10)
  assert _trainable_count(full) == 11_173_962


def test_resnet10_cifar_parameter_count():
  model = resnet.build_resnet10((32, 32, 3))
  trainable, total = _expected_counts((1, 1, 1, 1))
  assert _trainable_count(model) == trainable == 4_898_112
  assert model.count_params() == total


def test_resnet18_imagenet_stem_parameter_count_and_shapes():
  model = resnet.build_resnet18((224, 224, 3))
  trainable, total = _expected_counts((2, 2, 2, 2), small_input=False)
  # torchvision's resnet18 has 11,689,512 parameters including its
  # 1000-class fc layer (513,000).
  assert _trainable_count(model) == trainable == 11_689_512 - 513_000
  assert model.count_params() == total
  assert model.get_layer('stem_conv').kernel_size == (7, 7)
  assert model.get_layer('stem_pool').output_shape == (None, 56, 56, 64)
  assert model.get_layer('stage4_block2_out').output_shape == (
      None, 7, 7, 512
  )


@pytest.mark.parametrize(
    'side, small', [(28, True), (64, True), (65, False), (96, False)]
)
def test_small_input_default_depends_on_side(side, small):
  model = resnet.build_resnet10((side, side, 1))
  kernel = model.get_layer('stem_conv').kernel_size
  assert kernel == ((3, 3) if small else (7, 7))
  assert ('stem_pool' in [l.name for l in model.layers]) is not small


def test_small_input_override_and_odd_sizes():
  # Odd sizes: PyTorch-style padding gives ceil(n / 2) at each stride 2.
  model = resnet.build_resnet10((33, 33, 3), small_input=True)
  assert model.get_layer('stage4_block1_out').output_shape == (
      None, 5, 5, 512
  )
  model = resnet.build_resnet10((32, 32, 3), small_input=False)
  assert model.get_layer('stage4_block1_out').output_shape == (
      None, 1, 1, 512
  )
  assert model.output_shape == (None, 512)


def test_width_multiplier():
  model = resnet.build_resnet10((16, 16, 3), width=0.25)
  assert model.output_shape == (None, 128)
  trainable, _ = _expected_counts((1, 1, 1, 1), widths=(16, 32, 64, 128))
  assert _trainable_count(model) == trainable


def test_output_shape_and_name():
  model = resnet.build_resnet18((32, 32, 3))
  assert model.name == 'encoder'
  out = model(tf.zeros((2, 32, 32, 3)))
  assert out.shape == (2, 512)


@pytest.mark.parametrize('name', ['resnet10', 'resnet18'])
def test_one_gradient_step_changes_every_variable(name, classification_step):
  model = registry.build_model(
      name, (16, 16, 3), 5, encoder_options={'width': 0.25}
  )
  changed = classification_step(model, (16, 16, 3), 5)
  assert all(changed)


@pytest.mark.parametrize(
    'shape, match',
    [
        ((64,), 'resnet18: expects an input_shape of rank 3'),
        ((32, 32), 'rank 3'),
        ((32, 0, 3), 'positive'),
        ((32, 32.0, 3), 'positive int'),
        ('32x32', 'string'),
    ],
)
def test_bad_input_shape(shape, match):
  with pytest.raises(ValueError, match=match):
    resnet.build_resnet18(shape)


def test_bad_options():
  with pytest.raises(ValueError, match='width'):
    resnet.build_resnet10((32, 32, 3), width=0)
  with pytest.raises(ValueError, match='small_input'):
    resnet.build_resnet10((32, 32, 3), small_input='yes')
  with pytest.raises(ValueError, match='blocks_per_stage'):
    resnet.build_resnet((32, 32, 3), (1, 1, 1))
  with pytest.raises(TypeError, match='depth'):
    resnet.build_resnet18((32, 32, 3), depth=3)
