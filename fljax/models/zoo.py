"""The models of the papers fljax reproduces, initialised as their PyTorch code is.

Layer names follow the reference PyTorch code (conv1, fc1, ...), and each top-level name is one
module group for gradual unfreezing, in order from input to output.
"""

from __future__ import annotations

import inspect
from typing import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from fljax import registry
from fljax.errors import FljaxError
from fljax.models.layers import (DEFAULT_CONV_IMPL, BatchNorm, conv, conv1d, dense, dropout,
                                 max_pool, torch_bias_init)
from fljax.models.model import Model, from_module, input_spec_of
from fljax.models.resnet import cifar_resnet, torchvision_resnet
from fljax.models.gnn import GIN
from fljax.models.text import CharLSTM, TransformerClassifier
from fljax.models.vgg import VGG


class MLP(nn.Module):
    """Fully connected ReLU network on flattened inputs; with ``batch_norm``, torch's BatchNorm
    between each hidden layer and its ReLU (its statistics are model state)."""

    hidden: Sequence[int]
    num_classes: int
    batch_norm: bool = False

    @nn.compact
    def __call__(self, x, train: bool = False, with_features: bool = False, mask=None):
        x = x.reshape(x.shape[0], -1)
        for i, width in enumerate(self.hidden):
            x = dense(width, x.shape[-1], f"fc{i + 1}")(x)
            if self.batch_norm:
                x = BatchNorm(name=f"bn{i + 1}")(x, train, mask)
            x = nn.relu(x)
        logits = dense(self.num_classes, x.shape[-1], f"fc{len(self.hidden) + 1}")(x)
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
            x = conv(width, self.kernel, self.conv_impl, f"conv{i + 1}",
                     bias_init=torch_bias_init(fan_in))(x)
            x = max_pool(nn.relu(x))
        x = x.reshape(x.shape[0], -1)
        for i, width in enumerate(self.hidden):
            x = nn.relu(dense(width, x.shape[-1], f"fc{i + 1}")(x))
        logits = dense(self.num_classes, x.shape[-1], f"fc{len(self.hidden) + 1}")(x)
        return (x, logits) if with_features else logits


class ConvNet1D(nn.Module):
    """1-D conv(k, stride 2, padding 1) -> ReLU per (channels, kernel) pair; flatten; linear.

    On [N, L, C] signals. The MNIST-1D CNN (Greydanus 2020, ``ConvBase`` of the mnist1d code):
    three 25-channel convolutions with kernels 5, 3, 3, then one linear layer, 5,210 parameters
    for 40-sample signals (lengths 40 -> 19 -> 10 -> 5) and 10 classes. The features are the
    flattened output of the last convolution (position-major, where torch's view is
    channel-major: the linear layer's inputs are permuted, the model class is the same).
    """

    channels: Sequence[int]
    kernels: Sequence[int]
    num_classes: int
    conv_impl: str = "im2col"

    @nn.compact
    def __call__(self, x, train: bool = False, with_features: bool = False):
        x = x[:, :, None, :]   # [N, L, 1, C]
        for i, (width, kernel) in enumerate(zip(self.channels, self.kernels)):
            x = nn.relu(conv1d(width, kernel, kernel * x.shape[-1], self.conv_impl,
                               f"conv{i + 1}", stride=2, padding=1)(x))
        x = x.reshape(x.shape[0], -1)
        logits = dense(self.num_classes, x.shape[-1], "linear")(x)
        return (x, logits) if with_features else logits


class ConvNet2(nn.Module):
    """FederatedScope's ``ConvNet2`` (FedDecay's FEMNIST model): conv5x5-32 (padding 2) -> BN ->
    ReLU -> maxpool2 -> conv5x5-64 (padding 2) -> BN -> ReLU -> maxpool2 -> flatten -> dropout ->
    fc ``hidden`` -> ReLU -> dropout -> fc. BatchNorm is torch's (``layers.BatchNorm``): its
    running statistics are model state. The flatten is position-major (torch's is channel-major:
    fc1's inputs are permuted; the model class is the same). ``use_bn=False`` drops the BN layers.
    """

    num_classes: int
    hidden: int = 2048
    dropout: float = 0.0
    use_bn: bool = True
    conv_impl: str = "im2col"

    @nn.compact
    def __call__(self, x, train: bool = False, with_features: bool = False, mask=None):
        for i, width in enumerate((32, 64)):
            fan_in = 25 * x.shape[-1]
            x = conv(width, 5, self.conv_impl, f"conv{i + 1}", padding=2,
                     bias_init=torch_bias_init(fan_in))(x)
            if self.use_bn:
                x = BatchNorm(name=f"bn{i + 1}")(x, train, mask)
            x = max_pool(nn.relu(x))
        x = x.reshape(x.shape[0], -1)
        x = dropout(self, train)(x)
        x = nn.relu(dense(self.hidden, x.shape[-1], "fc1")(x))
        x = dropout(self, train)(x)
        logits = dense(self.num_classes, x.shape[-1], "fc2")(x)
        return (x, logits) if with_features else logits


class TorchMnistNet(nn.Module):
    """The network of Karimireddy, He, Jaggi (ICLR 2022)'s MNIST experiments (``Net`` in
    ``epfml/byzantine-robust-noniid-optimizer``'s ``codes/tasks/mnist.py``, the PyTorch MNIST
    example's):

        conv3x3-32 -> ReLU -> conv3x3-64 -> maxpool2 -> Dropout2d(0.25) -> flatten
        -> fc128 -> ReLU -> dropout(0.5) -> fc

    with no ReLU after the second convolution, as that code has it; 1,199,882 parameters for 28x28
    inputs and 10 classes. The first dropout drops whole channels (torch's ``Dropout2d`` on a 4-D
    tensor), the second single units (``Dropout2d`` on the [N, 128] features, element-wise in the
    torch of the paper's time). The flatten is position-major (torch's is channel-major: fc1's
    inputs are permuted; the model class is the same).
    """

    num_classes: int
    conv_impl: str = "im2col"

    @nn.compact
    def __call__(self, x, train: bool = False, with_features: bool = False):
        deterministic = not (train and self.has_rng("dropout"))
        x = conv(32, 3, self.conv_impl, "conv1", bias_init=torch_bias_init(9 * x.shape[-1]))(x)
        x = max_pool(conv(64, 3, self.conv_impl, "conv2", bias_init=torch_bias_init(9 * 32))(
            nn.relu(x)))
        x = nn.Dropout(0.25, broadcast_dims=(1, 2), deterministic=deterministic)(x)
        x = x.reshape(x.shape[0], -1)
        x = nn.relu(dense(128, x.shape[-1], "fc1")(x))
        x = nn.Dropout(0.5, deterministic=deterministic)(x)
        logits = dense(self.num_classes, x.shape[-1], "fc2")(x)
        return (x, logits) if with_features else logits


# name -> (builder(num_classes, conv_impl), smallest spatial input shape it accepts: (H, W) of
# images [H, W, C], (L,) of signals [L, C], or None for any input, flattened)
_MODELS: dict[str, tuple[Callable[[int, str], nn.Module], tuple[int, ...] | None]] = {
    "linear": (lambda classes, impl: MLP(hidden=(), num_classes=classes), None),
    "mlp": (lambda classes, impl: MLP(hidden=(200, 200), num_classes=classes), None),
    "mlp_bn": (lambda classes, impl: MLP(hidden=(200, 200), num_classes=classes,
                                         batch_norm=True), None),
    "small_cnn": (lambda classes, impl: ConvNet(channels=(16, 32), hidden=(128,),
                                                num_classes=classes, conv_impl=impl), (13, 13)),
    "standard_cnn": (lambda classes, impl: ConvNet(channels=(64, 64), hidden=(384, 192),
                                                   num_classes=classes, conv_impl=impl), (13, 13)),
    "tiny_cnn": (lambda classes, impl: ConvNet(channels=(64, 64, 64), hidden=(256, 128),
                                               num_classes=classes, conv_impl=impl), (36, 36)),
    "mnist_net": (lambda classes, impl: TorchMnistNet(num_classes=classes, conv_impl=impl),
                  (6, 6)),
    "emnist_cnn": (lambda classes, impl: ConvNet(channels=(32, 64), hidden=(),
                                                 num_classes=classes, conv_impl=impl), (16, 16)),
    "resnet18_gn": (lambda classes, impl: torchvision_resnet((2, 2, 2, 2), classes, impl), (1, 1)),
    "resnet34_gn": (lambda classes, impl: torchvision_resnet((3, 4, 6, 3), classes, impl), (1, 1)),
    "resnet20": (lambda classes, impl: cifar_resnet(3, classes, impl), (1, 1)),
    "vgg11": (lambda classes, impl: VGG(num_classes=classes, conv_impl=impl), (32, 32)),
    "convnet2": (lambda classes, impl: ConvNet2(num_classes=classes, conv_impl=impl), (4, 4)),
    "cnn1d": (lambda classes, impl: ConvNet1D(channels=(25, 25, 25), kernels=(5, 3, 3),
                                              num_classes=classes, conv_impl=impl), (3,)),
}
# token models: name -> builder(num_classes), for int32 sequences [T]
_TOKEN_MODELS: dict[str, Callable[[int], nn.Module]] = {
    "char_lstm": lambda classes: CharLSTM(vocab=classes),
    "bert_tiny": lambda classes: TransformerClassifier(num_classes=classes),
}
# graph models: name -> builder(num_classes), for fljax.data.graphs' padded subgraphs
_GRAPH_MODELS: dict[str, Callable[[int], nn.Module]] = {"gin": lambda classes: GIN(classes)}
GRAPH_KEYS = {"nodes", "senders", "receivers", "edge_mask", "node_mask"}
MODEL_NAMES = tuple(_MODELS) + tuple(_TOKEN_MODELS) + tuple(_GRAPH_MODELS)


def own_model(name: str, factory: Callable, spec, num_classes: int) -> Model:
    """A user's model: ``factory(num_classes=..., input_shape=...)`` (the arguments its signature
    names; ``input_shape`` is one example's shape) returns a Flax module, made a Model by
    ``from_module`` for inputs like ``spec``, or a ``Model`` itself."""
    accepted = inspect.signature(factory).parameters
    offered = {"num_classes": num_classes,
               "input_shape": getattr(spec, "shape", None)}
    built = factory(**{k: v for k, v in offered.items() if k in accepted})
    if isinstance(built, Model):
        return built
    if not isinstance(built, nn.Module):
        raise FljaxError(f"model {name!r}: its factory must return a Flax module or a "
                         f"fljax.Model, got {type(built).__name__}")
    return from_module(name, built, spec, num_classes)


def make_model(name: str, input_shape, num_classes: int,
               conv_impl: str | None = None) -> Model:
    """Build a named model for inputs of ``input_shape`` and ``num_classes`` classes: images
    (H, W, C) for the 2-D CNNs, signals (L, C) for ``cnn1d``, any shape for ``linear``/``mlp``.
    ``input_shape`` may also be one example (an array, or a dict of arrays for a graph): its
    shape and dtype are the model's input spec.

    - ``linear``: softmax (multinomial logistic) regression on the flattened input: a convex
      model, for checks of convex theory (FedDyn as initialization (Anonymous, 2024) Proposition 1).
    - ``mlp``: 200-200 ReLU MLP (McMahan et al. 2017's 2NN); ``mlp_bn`` with BatchNorm after
      each hidden layer (a small model with state, e.g. for FedBN on vectors).
    - ``small_cnn``: conv5x5-16, pool, conv5x5-32, pool, fc128, fc (the 28x28 benchmark CNN).
    - ``standard_cnn``: conv5x5-64, pool, conv5x5-64, pool, fc384, fc192, fc (FedDyn / FedBug).
    - ``tiny_cnn``: conv5x5-64 + pool three times, fc256, fc128, fc (FedBug's Tiny-ImageNet CNN:
      "three convolutional layers followed by three fully connected layers"; 64x64 -> 4x4x64;
      the widths of the official code's ``Linear(64*4*4, 256)``, ``Linear(256, 128)``).
    - ``mnist_net``: conv3x3-32, ReLU, conv3x3-64, pool, channel dropout 0.25, fc128, dropout
      0.5, fc (Karimireddy et al. 2022's MNIST network, the PyTorch MNIST example's; 1,199,882
      parameters on 28x28 images).
    - ``emnist_cnn``: conv5x5-32, pool, conv5x5-64, pool, fc (FedGA's ``cnn_mnist``; 100,271
      parameters for EMNIST-balanced's 47 classes).
    - ``resnet18_gn`` / ``resnet34_gn``: torchvision ImageNet-style ResNet-18/34 with
      GroupNorm(2, C) (FedInit's ResNet-18-GN, FedBug, FedDyn as initialization on Tiny-ImageNet).
    - ``resnet20``: CIFAR ResNet-20 with GroupNorm(2, C) (FedDyn as initialization, CIFAR-100).
    - ``vgg11``: VGG-11 for 32x32 inputs (FedInit, FedDyn as initialization on CIFAR-10).
    - ``convnet2``: FederatedScope's ConvNet2 with BatchNorm (FedDecay's FEMNIST model; 2048
      hidden units; its BN statistics are model state).
    - ``char_lstm``: LEAF/FedGA's Shakespeare model, embedding 8, 2 x LSTM 100, next character at
      every position (int32 tokens [T]; the classes are the alphabet).
    - ``bert_tiny``: a BERT-Tiny-shaped transformer classifier (2 layers, hidden 128, 2 heads) on
      int32 tokens [T] (pad 0); ``--pretrained`` loads a local BERT checkpoint.
    - ``gin``: FederatedScope's GIN (2 GIN layers with BatchNorm, hidden 64, dropout 0.5), per
      node logits of a graph dataset's padded subgraphs.
    - ``cnn1d``: conv5-25, conv3-25, conv3-25 (stride 2, ReLU), linear: the MNIST-1D CNN
      (5,210 parameters on 40-sample signals, 10 classes).
    ``conv_impl`` is 'im2col' or 'xla'; the default is the fast one for the current backend.

    Any other ``name`` is a user's model (``fljax.registry``): an import path
    'package.module:factory' or a name given to ``fljax.register_model``, built by
    ``own_model``.
    """
    spec = input_spec_of(input_shape)
    if name not in MODEL_NAMES:
        return own_model(name, registry.lookup("model", name, known=MODEL_NAMES), spec,
                         num_classes)
    if name in _TOKEN_MODELS:
        if not (isinstance(spec, jax.ShapeDtypeStruct) and len(spec.shape) == 1 and
                jnp.issubdtype(spec.dtype, jnp.integer)):
            raise FljaxError(f"model {name!r} needs integer token sequences [T], got "
                             f"{jax.tree.map(lambda s: f'{s.dtype}{list(s.shape)}', spec)}")
        return from_module(name, _TOKEN_MODELS[name](num_classes), spec, num_classes)
    if name in _GRAPH_MODELS:
        if not (isinstance(spec, dict) and set(spec) == GRAPH_KEYS):
            raise FljaxError(f"model {name!r} needs a graph dataset's subgraphs (a dict of "
                             f"{sorted(GRAPH_KEYS)}), e.g. dataset planetoid/pubmed")
        return from_module(name, _GRAPH_MODELS[name](num_classes), spec, num_classes)
    if not (isinstance(spec, jax.ShapeDtypeStruct) and jnp.issubdtype(spec.dtype, jnp.floating)):
        raise FljaxError(f"model {name!r} needs float inputs (images, signals or vectors), got "
                         f"{jax.tree.map(lambda s: f'{s.dtype}{list(s.shape)}', spec)}")
    input_shape = spec.shape
    build, least = _MODELS[name]
    if least is not None and (len(input_shape) != len(least) + 1 or
                              any(s < m for s, m in zip(input_shape, least))):
        if len(least) == 2:
            raise FljaxError(f"model {name!r} needs images [H, W, C] of at least "
                             f"{least[0]}x{least[1]} pixels, got {tuple(input_shape)}; use model "
                             f"'mlp' for small inputs such as digits")
        raise FljaxError(f"model {name!r} needs signals [L, C] of length at least {least[0]}, "
                         f"got {tuple(input_shape)}")
    module = build(num_classes, conv_impl or DEFAULT_CONV_IMPL)
    return from_module(name, module, tuple(input_shape), num_classes)
