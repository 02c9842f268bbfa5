"""Tests for keras_models._validation."""

import pathlib

import pytest

from keras_models import _validation


def test_spatial_arithmetic():
  conv_pool = (('conv', 5, 1, 0), ('pool', 2, 2, 0))
  assert _validation.spatial_output_size(28, conv_pool * 2) == 4
  assert _validation.spatial_output_size(32, conv_pool * 2) == 5
  assert _validation.spatial_output_size(15, conv_pool * 2) == 0
  assert _validation.min_spatial_size(conv_pool * 2) == 16
  assert _validation.min_spatial_size((('pool', 2, 2, 0),) * 5) == 32
  # PyTorch-style padded 3x3 stride-2 convolution: ceil(n / 2).
  assert _validation.spatial_output_size(7, (('conv', 3, 2, 2),)) == 4


def test_check_input_shape():
  assert _validation.check_input_shape('m', [32, 32, 3], 3) == (32, 32, 3)
  with pytest.raises(ValueError, match=r'm: expects an input_shape of rank 1'):
    _validation.check_input_shape('m', (2, 2), 1)
  with pytest.raises(ValueError, match='m: input_shape must be a sequence'):
    _validation.check_input_shape('m', 32, 1)
  with pytest.raises(ValueError, match='positive int'):
    _validation.check_input_shape('m', (None, 32, 3), 3)
  with pytest.raises(ValueError, match='positive int'):
    _validation.check_input_shape('m', (True,), 1)


def test_check_local_weights(tmp_path):
  path = tmp_path / 'w.h5'
  path.write_bytes(b'')
  assert _validation.check_local_weights('m', None) is None
  assert _validation.check_local_weights('m', path) == str(path)
  with pytest.raises(ValueError, match="m: weights='imagenet' would download"):
    _validation.check_local_weights('m', 'imagenet')
  with pytest.raises(ValueError, match='is not a file'):
    _validation.check_local_weights('m', pathlib.Path(tmp_path / 'none.h5'))
  with pytest.raises(ValueError, match='is not a file'):
    _validation.check_local_weights('m', str(tmp_path))
