"""Tests for keras_models.vgg (VGG-11 encoder)."""

import pytest
import tensorflow as tf

from keras_models import registry
from keras_models import vgg

# torchvision's vgg11().features: 3x3 convolutions with bias,
# sum of 9*c_in*c_out + c_out over
# (3,64), (64,128), (128,256), (256,256), (256,512), (512,512) x 3.
_VGG11_CONV_PARAMS = 9_220_480


def test_vgg11_32x32_flattens_1x1_map():
  model = vgg.build_vgg11((32, 32, 3))
  assert model.name == 'encoder'
  assert model.get_layer('pool5').output_shape == (None, 1, 1, 512)
  assert 'flatten' in [l.name for l in model.layers]
  assert model.output_shape == (None, 512)
  assert model.count_params() == _VGG11_CONV_PARAMS
  assert model(tf.zeros((2, 32, 32, 3))).shape == (2, 512)


def test_vgg11_larger_input_uses_average_pooling():
  model = vgg.build_vgg11((64, 48, 1))
  assert model.get_layer('pool5').output_shape == (None, 2, 1, 512)
  assert 'avg_pool' in [l.name for l in model.layers]
  assert model.output_shape == (None, 512)


def test_vgg11_batch_norm_and_hidden():
  model = vgg.build_vgg11((32, 32, 3), batch_norm=True, hidden=64)
  assert model.output_shape == (None, 64)
  # 8 batch norms: 4 weights per channel, 2 of them trainable.
  bn_channels = 64 + 128 + 256 * 2 + 512 * 4
  assert model.count_params() == (
      _VGG11_CONV_PARAMS + 4 * bn_channels + 512 * 64 + 64
  )


def _conv_params(widths):
  """Kernel and bias parameters of VGG-11's eight convolutions."""
  c64, c128, c256, c512 = widths
  pairs = [(3, c64), (c64, c128), (c128, c256), (c256, c256), (c256, c512),
           (c512, c512), (c512, c512), (c512, c512)]
  return sum(9 * c_in * c_out + c_out for c_in, c_out in pairs)


def test_conv_params_helper_matches_torchvision():
  assert _conv_params((64, 128, 256, 512)) == _VGG11_CONV_PARAMS


def test_width_multiplier():
  model = vgg.build_vgg11((32, 32, 3), width=0.25)
  assert model.output_shape == (None, 128)
  assert model.get_layer('conv1').filters == 16
  assert model.get_layer('conv8').filters == 128
  assert model.count_params() == _conv_params((16, 32, 64, 128))
  # Through the registry, as a grid program passes it.
  full = registry.build_model('vgg11', (32, 32, 3), 10,
                              encoder_options={'width': 0.25})
  assert full.get_layer('encoder').output_shape == (None, 128)
  assert full.output_shape == (None, 10)
  # Rounded, never below one filter.
  tiny = vgg.build_vgg11((32, 32, 3), width=0.001)
  assert tiny.output_shape == (None, 1)


def test_minimum_input_size_is_32():
  assert vgg.MIN_INPUT_SIZE == 32
  with pytest.raises(ValueError, match=r'vgg11: .*at least 32'):
    vgg.build_vgg11((31, 32, 3))
  with pytest.raises(ValueError, match='vgg11: expects an input_shape'):
    vgg.build_vgg11((3072,))


def test_bad_options():
  with pytest.raises(ValueError, match='batch_norm'):
    vgg.build_vgg11((32, 32, 3), batch_norm=1)
  with pytest.raises(ValueError, match='hidden'):
    vgg.build_vgg11((32, 32, 3), hidden=-1)
  for width in (0, -0.5, float('nan'), 'wide'):
    with pytest.raises(ValueError, match='width'):
      vgg.build_vgg11((32, 32, 3), width=width)


def test_one_gradient_step_changes_every_variable(classification_step):
  model = registry.build_model(
      'vgg11', (32, 32, 3), 10, encoder_options={'batch_norm': True}
  )
  assert all(classification_step(model, (32, 32, 3), 10))
