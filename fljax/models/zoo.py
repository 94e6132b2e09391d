"""The models of the papers fljax reproduces, initialised as their PyTorch code is.

Layer names follow the reference PyTorch code (conv1, fc1, ...), and each top-level name is one
module group for gradual unfreezing, in order from input to output.
"""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn

from fljax.errors import FljaxError
from fljax.models.layers import (conv_function, default_conv_impl, max_pool, torch_bias_init,
                                 torch_kernel_init)
from fljax.models.model import Model, from_module


def _dense(features: int, fan_in: int, name: str) -> nn.Dense:
    return nn.Dense(features, kernel_init=torch_kernel_init(), bias_init=torch_bias_init(fan_in),
                    name=name)


def _conv(features: int, kernel: int, fan_in: int, impl: str, name: str, padding="VALID") -> nn.Conv:
    return nn.Conv(features, (kernel, kernel), padding=padding, kernel_init=torch_kernel_init(),
                   bias_init=torch_bias_init(fan_in), conv_general_dilated=conv_function(impl),
                   name=name)


class MLP(nn.Module):
    """Fully connected ReLU network on flattened inputs."""

    hidden: Sequence[int]
    num_classes: int

    @nn.compact
    def __call__(self, x, train: bool = False, with_features: bool = False):
        x = x.reshape(x.shape[0], -1)
        for i, width in enumerate(self.hidden):
            x = nn.relu(_dense(width, x.shape[-1], f"fc{i + 1}")(x))
        logits = _dense(self.num_classes, x.shape[-1], f"fc{len(self.hidden) + 1}")(x)
        return (x, logits) if with_features else logits


class ConvNet(nn.Module):
    """conv(k x k, VALID) -> ReLU -> maxpool2, per entry of ``channels``; then ReLU dense layers.

    ``channels=(64, 64), hidden=(384, 192)`` on 32x32x3 is the "standard CNN" of the FedDyn and
    FedBug code (797,962 parameters for 10 classes); ``channels=(32, 64), hidden=()`` on 28x28x1 is
    the FedGA EMNIST CNN.
    """

    channels: Sequence[int]
    hidden: Sequence[int]
    num_classes: int
    kernel: int = 5
    conv_impl: str = "im2col"

    @nn.compact
    def __call__(self, x, train: bool = False, with_features: bool = False):
        for i, width in enumerate(self.channels):
            fan_in = self.kernel * self.kernel * x.shape[-1]
            x = _conv(width, self.kernel, fan_in, self.conv_impl, f"conv{i + 1}")(x)
            x = max_pool(nn.relu(x))
        x = x.reshape(x.shape[0], -1)
        for i, width in enumerate(self.hidden):
            x = nn.relu(_dense(width, x.shape[-1], f"fc{i + 1}")(x))
        logits = _dense(self.num_classes, x.shape[-1], f"fc{len(self.hidden) + 1}")(x)
        return (x, logits) if with_features else logits


MODEL_NAMES = ("mlp", "small_cnn", "standard_cnn")


def make_model(name: str, input_shape: Sequence[int], num_classes: int,
               conv_impl: str | None = None) -> Model:
    """Build a named model for inputs of ``input_shape`` (H, W, C) and ``num_classes`` classes.

    - ``mlp``: 200-200 ReLU MLP (McMahan et al. 2017's 2NN).
    - ``small_cnn``: conv5x5-16, pool, conv5x5-32, pool, fc128, fc (the 28x28 benchmark CNN).
    - ``standard_cnn``: conv5x5-64, pool, conv5x5-64, pool, fc384, fc192, fc (FedDyn / FedBug).
    ``conv_impl`` is 'im2col' or 'xla'; the default is the fast one for the current backend.
    """
    conv_impl = conv_impl or default_conv_impl()
    if name == "mlp":
        module = MLP(hidden=(200, 200), num_classes=num_classes)
    elif name == "small_cnn":
        module = ConvNet(channels=(16, 32), hidden=(128,), num_classes=num_classes,
                         conv_impl=conv_impl)
    elif name == "standard_cnn":
        module = ConvNet(channels=(64, 64), hidden=(384, 192), num_classes=num_classes,
                         conv_impl=conv_impl)
    else:
        raise FljaxError(f"unknown model {name!r}; choose one of {MODEL_NAMES}")
    if name != "mlp" and min(input_shape[:2]) < 13:
        raise FljaxError(f"model {name!r} needs images of at least 13x13 pixels, got "
                         f"{tuple(input_shape)}; use model 'mlp' for small inputs such as digits")
    return from_module(name, module, tuple(input_shape), num_classes)
