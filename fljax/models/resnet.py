"""ResNets with GroupNorm (He et al., "Deep Residual Learning for Image Recognition", CVPR 2016).

Every BatchNorm of the original, downsample ones included, is ``GroupNorm(2, C)``, so no batch
statistics exist and every parameter is averaged by the server (Hsieh et al. 2020; the FedDyn,
FL-Simulator and FedBug code).

Top-level parameters are the finest FedBug unfreezing units, input to output: ``stem``, then one
entry per residual block, ``layer{stage}_{block}`` (torch ``layer{stage}[{block}]``), then ``fc``.
"""

from __future__ import annotations

from typing import Callable, Sequence

import flax.linen as nn
import jax.numpy as jnp

from fljax.errors import FljaxError
from fljax.models.layers import conv, dense, group_norm, kaiming_normal, max_pool, torch_kernel_init

SHORTCUTS = ("conv", "pad")


class BasicBlock(nn.Module):
    """relu(norm2(conv2(relu(norm1(conv1(x))))) + shortcut(x)), both convs 3x3 without bias.

    The first conv carries the block's stride. When the shape changes the shortcut is either
    ``'conv'`` (option B, torchvision's ``downsample``: 1x1 strided conv + norm) or ``'pad'``
    (option A of He et al.'s CIFAR ResNets: subsample by the stride, zero-pad the new channels).
    """

    features: int
    stride: int
    shortcut: str
    conv_init: Callable
    conv_impl: str

    @nn.compact
    def __call__(self, x):
        def conv3x3(stride, name):
            return conv(self.features, 3, self.conv_impl, name, stride=stride, padding=1,
                        kernel_init=self.conv_init)

        y = nn.relu(group_norm("norm1")(conv3x3(self.stride, "conv1")(x)))
        y = group_norm("norm2")(conv3x3(1, "conv2")(y))
        if self.stride != 1 or x.shape[-1] != self.features:
            if self.shortcut == "conv":
                x = conv(self.features, 1, self.conv_impl, "down_conv", stride=self.stride,
                         kernel_init=self.conv_init)(x)
                x = group_norm("down_norm")(x)
            else:
                extra = self.features - x.shape[-1]
                x = jnp.pad(x[:, ::self.stride, ::self.stride, :],
                            ((0, 0), (0, 0), (0, 0), (extra // 2, extra - extra // 2)))
        return nn.relu(y + x)


class Stem(nn.Module):
    """conv(kernel, stride, padding kernel // 2, no bias) -> norm -> relu [-> maxpool(3, 2, 1)]."""

    features: int
    kernel: int
    stride: int
    pool: bool
    conv_init: Callable
    conv_impl: str

    @nn.compact
    def __call__(self, x):
        x = conv(self.features, self.kernel, self.conv_impl, "conv", stride=self.stride,
                 padding=self.kernel // 2, kernel_init=self.conv_init)(x)
        x = nn.relu(group_norm("norm")(x))
        return max_pool(x, 3, 2, 1) if self.pool else x


class ResNet(nn.Module):
    """Stem, stages of BasicBlocks (the first block of every stage but the first has stride 2),
    global average pooling (the features) and a Linear classifier ``fc``.

    ``imagenet_stem``: torchvision's 7x7/2 conv + 3x3/2 maxpool; otherwise the CIFAR 3x3/1 conv.
    ``conv_init`` / ``fc_init`` initialise the conv and fc kernels (the fc bias is PyTorch's
    default), GroupNorm starts at scale 1, bias 0.
    """

    stage_sizes: Sequence[int]
    widths: Sequence[int]
    num_classes: int
    imagenet_stem: bool
    shortcut: str
    conv_init: Callable
    fc_init: Callable
    conv_impl: str = "im2col"

    @nn.compact
    def __call__(self, x, train: bool = False, with_features: bool = False):
        if self.shortcut not in SHORTCUTS:
            raise FljaxError(f"ResNet shortcut must be one of {SHORTCUTS}, got {self.shortcut!r}")
        kernel, stride = (7, 2) if self.imagenet_stem else (3, 1)
        x = Stem(self.widths[0], kernel, stride, self.imagenet_stem, self.conv_init, self.conv_impl,
                 name="stem")(x)
        for stage, (blocks, width) in enumerate(zip(self.stage_sizes, self.widths)):
            for block in range(blocks):
                x = BasicBlock(width, 2 if stage > 0 and block == 0 else 1, self.shortcut,
                               self.conv_init, self.conv_impl,
                               name=f"layer{stage + 1}_{block}")(x)
        features = x.mean(axis=(1, 2))
        logits = dense(self.num_classes, features.shape[-1], "fc", self.fc_init)(features)
        return (features, logits) if with_features else logits


def torchvision_resnet(stage_sizes: Sequence[int], num_classes: int, conv_impl: str) -> ResNet:
    """torchvision's ImageNet ``resnet18`` ([2, 2, 2, 2]) / ``resnet34`` ([3, 4, 6, 3]), new fc.

    Widths 64..512, 7x7/2 stem and maxpool, 1x1-conv downsample shortcuts, all BatchNorms as
    GroupNorm(2, C) as in FedDyn's / FL-Simulator's ``ResNet18`` (FedInit's ResNet-18-GN) and
    FedBug's ``resnet34``; FedBug's own ``resnet18`` keeps BatchNorm, here it is GroupNorm too.
    Init as torchvision: kaiming_normal(fan_out) convs, PyTorch-default fc. On 32x32 inputs the
    last feature map is 1x1.
    """
    return ResNet(stage_sizes, (64, 128, 256, 512), num_classes, imagenet_stem=True,
                  shortcut="conv", conv_init=kaiming_normal("fan_out"),
                  fc_init=torch_kernel_init(), conv_impl=conv_impl)


def cifar_resnet(blocks_per_stage: int, num_classes: int, conv_impl: str) -> ResNet:
    """He et al.'s CIFAR ResNet-(6n+2) (n = 3: ResNet-20), as FedDecorr's ``resnetcifar``.

    3x3/1 stem, three stages of n BasicBlocks at widths 16, 32, 64, option-A (parameter-free)
    shortcuts as in He et al. Sec. 4.2, kaiming_normal(fan_in) conv and fc kernels; GroupNorm(2, C)
    in place of BatchNorm. The features are the 64 pooled channels.
    """
    return ResNet((blocks_per_stage,) * 3, (16, 32, 64), num_classes, imagenet_stem=False,
                  shortcut="pad", conv_init=kaiming_normal("fan_in"),
                  fc_init=kaiming_normal("fan_in"), conv_impl=conv_impl)
