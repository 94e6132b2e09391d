"""Models: pure apply functions, penultimate features and ordered module groups."""

from fljax.models.layers import CONV_IMPLS, default_conv_impl, im2col_conv, max_pool
from fljax.models.model import Model, cross_entropy, from_module, num_params
from fljax.models.zoo import MODEL_NAMES, ConvNet, MLP, make_model

__all__ = ["CONV_IMPLS", "ConvNet", "MLP", "MODEL_NAMES", "Model", "cross_entropy",
           "default_conv_impl", "from_module", "im2col_conv", "make_model", "max_pool", "num_params"]
