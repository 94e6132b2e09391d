"""VGG-11 for CIFAR (Simonyan & Zisserman 2015, configuration 'A' without BatchNorm).

The FedInit and FedDyn-as-initialization papers name VGG-11 for CIFAR-10 without its classifier;
this is the common FL-code one, FedNova's ``models/vgg.py:vgg11``: 3x3 convs (padding 1) + ReLU
with 2x2 max pools at ``64, M, 128, M, 256, 256, M, 512, 512, M, 512, 512, M``, so a 32x32 input
ends at 1x1x512; then the classifier Dropout(0.5), Linear(512, 512), ReLU, Dropout(0.5),
Linear(512, 512), ReLU, Linear(512, C). Convs start at N(0, 2 / (3 * 3 * out)) with zero bias,
Linears at PyTorch's default.
Top-level parameters are ``conv1..conv8`` then ``fc1..fc3``.
"""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn

from fljax.models.layers import conv, dense, dropout, kaiming_normal, max_pool

VGG11 = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")


class VGG(nn.Module):
    """``cfg`` entries are conv widths or 'M' (max pool 2); features: the last hidden layer."""

    num_classes: int
    cfg: Sequence[int | str] = VGG11
    hidden: int = 512
    dropout: float = 0.5
    conv_impl: str = "im2col"

    @nn.compact
    def __call__(self, x, train: bool = False, with_features: bool = False):
        convs = 0
        for entry in self.cfg:
            if entry == "M":
                x = max_pool(x)
            else:
                convs += 1
                x = nn.relu(conv(entry, 3, self.conv_impl, f"conv{convs}", padding=1,
                                 kernel_init=kaiming_normal("fan_out"),
                                 bias_init=nn.initializers.zeros)(x))
        x = x.reshape(x.shape[0], -1)
        for i in range(2):
            x = dropout(self, train)(x)
            x = nn.relu(dense(self.hidden, x.shape[-1], f"fc{i + 1}")(x))
        logits = dense(self.num_classes, x.shape[-1], "fc3")(x)
        return (x, logits) if with_features else logits
