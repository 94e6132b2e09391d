"""Models: pure apply functions, penultimate features, ordered module groups, and their evaluation
on data (``fljax.models.evaluate``: it may import ``fljax.data``)."""

from fljax.models.layers import CONV_IMPLS, DEFAULT_CONV_IMPL, im2col_conv, max_pool
from fljax.models.mixture import mixture
from fljax.models.model import Model, cross_entropy, from_module, num_params
from fljax.models.resnet import BasicBlock, ResNet, cifar_resnet, torchvision_resnet
from fljax.models.unfreeze import UNFREEZE_UNITS, unfreeze_units
from fljax.models.vgg import VGG
from fljax.models.zoo import MODEL_NAMES, ConvNet, ConvNet1D, MLP, make_model

__all__ = ["BasicBlock", "CONV_IMPLS", "ConvNet", "ConvNet1D", "DEFAULT_CONV_IMPL", "MLP",
           "MODEL_NAMES", "Model", "ResNet", "UNFREEZE_UNITS", "VGG", "cifar_resnet", "cross_entropy",
           "from_module", "im2col_conv", "make_model", "max_pool", "mixture", "num_params",
           "torchvision_resnet", "unfreeze_units"]
