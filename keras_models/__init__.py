"""Keras (tf.keras 2.14) encoders, heads and layers for personalized FL.

Models are `inputs -> encoder -> head -> outputs` (see `build_model`), so that
personalization algorithms can share the encoder and keep the head local.
This package depends only on TensorFlow, never on TensorFlow Federated.
"""

from keras_models.cnn import build_fedavg_cnn
from keras_models.cnn import build_simple_cnn
from keras_models.heads import build_discriminator
from keras_models.heads import build_linear_head
from keras_models.heads import build_regression_head
from keras_models.layers import GradientReversal
from keras_models.layers import reverse_gradient
from keras_models.layers import SeededDropout
from keras_models.mlp import build_mlp
from keras_models.mobilenet_v2 import build_mobilenet_v2
from keras_models.registry import build_encoder
from keras_models.registry import build_head
from keras_models.registry import build_model
from keras_models.registry import check_encoder_options
from keras_models.registry import describe
from keras_models.registry import ENCODERS
from keras_models.registry import HEADS
from keras_models.registry import list_encoders
from keras_models.registry import list_heads
from keras_models.registry import split_trainable_variables
from keras_models.registry import UnknownNameError
from keras_models.resnet import build_resnet
from keras_models.resnet import build_resnet10
from keras_models.resnet import build_resnet18
from keras_models.resnet50 import build_resnet50
from keras_models.vgg import build_vgg11

__all__ = [
    'ENCODERS',
    'GradientReversal',
    'HEADS',
    'SeededDropout',
    'UnknownNameError',
    'build_discriminator',
    'build_encoder',
    'build_fedavg_cnn',
    'build_head',
    'build_linear_head',
    'build_mlp',
    'build_mobilenet_v2',
    'build_model',
    'build_regression_head',
    'build_resnet',
    'build_resnet10',
    'build_resnet18',
    'build_resnet50',
    'build_simple_cnn',
    'build_vgg11',
    'check_encoder_options',
    'describe',
    'list_encoders',
    'list_heads',
    'reverse_gradient',
    'split_trainable_variables',
]
