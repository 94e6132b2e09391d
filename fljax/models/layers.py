"""Layers that run at full speed inside ``lax.scan`` on every backend, built as PyTorch builds them.

XLA's CPU convolution takes a slow path inside a while loop (jax issue 12868): a local-training
``lax.scan`` of a small CNN runs ~15x slower than the same steps unrolled. Written as im2col
(shifted slices concatenated on the channel axis) followed by one matmul it does not. Both
implementations share parameters and layout, so a model can switch between them freely.
Max pooling is written the same way. ``conv``, ``dense`` and ``group_norm`` build Flax layers with
PyTorch's padding, epsilon and default initialisation.
"""

from __future__ import annotations

import functools
import math
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from fljax.errors import FljaxError

CONV_IMPLS = ("im2col", "xla")


def im2col_conv(lhs, rhs, window_strides, padding, lhs_dilation=None, rhs_dilation=None,
                dimension_numbers=None, feature_group_count=1, precision=None, **_):
    """Drop-in ``lax.conv_general_dilated`` for NHWC inputs and HWIO kernels, as slices + matmul.

    out[n, y, x, o] = sum_{i, j, c} pad(lhs)[n, y*s + i, x*s + j, c] * rhs[i, j, c, o]
    """
    if feature_group_count != 1 or any(d != 1 for d in (lhs_dilation or ())) or any(
            d != 1 for d in (rhs_dilation or ())):
        raise FljaxError("im2col conv supports feature_group_count=1 and no dilation; "
                         "use conv_impl='xla' for grouped or dilated convolutions")
    kh, kw, cin, cout = rhs.shape
    sh, sw = window_strides
    if isinstance(padding, str):
        padding = lax.padtype_to_pads(lhs.shape[1:3], (kh, kw), window_strides, padding)
    lhs = jnp.pad(lhs, ((0, 0), tuple(padding[0]), tuple(padding[1]), (0, 0)))
    height = (lhs.shape[1] - kh) // sh + 1
    width = (lhs.shape[2] - kw) // sw + 1
    patches = jnp.concatenate(
        [lhs[:, i:i + sh * (height - 1) + 1:sh, j:j + sw * (width - 1) + 1:sw, :]
         for i in range(kh) for j in range(kw)], axis=-1)
    return jnp.dot(patches, rhs.reshape(kh * kw * cin, cout), precision=precision)


def conv_function(impl: str):
    """The convolution primitive for ``impl`` in CONV_IMPLS."""
    if impl not in CONV_IMPLS:
        raise FljaxError(f"conv_impl must be one of {CONV_IMPLS}, got {impl!r}")
    return im2col_conv if impl == "im2col" else lax.conv_general_dilated


# im2col on every backend: XLA's CPU conv is slow inside scan (jax issue 12868), and on an H100 a
# round of the pfl-research CIFAR-10 CNN ran 1.1x (clients sequential) to 2x (clients vmapped, where
# XLA's becomes a grouped conv with a slow backward, jax issue 13800) faster with im2col
# (BENCHMARKS.md, GPU rows, step 4).
DEFAULT_CONV_IMPL = "im2col"


def dropout(module: nn.Module, train: bool) -> nn.Dropout:
    """``module``'s dropout (rate ``module.dropout``), on in training when the call was given a
    'dropout' rng; a training-mode call without one (``Model.apply(..., train=True, rng=None)``,
    e.g. a client's full gradient) runs without dropout. Call it inside a compact method."""
    return nn.Dropout(module.dropout, deterministic=not (train and module.has_rng("dropout")))


def max_pool(x, window: int = 2, stride: int | None = None, padding: int = 0):
    """torch ``MaxPool2d(window, stride, padding)`` (floor mode; stride defaults to window) on NHWC.

    out[n, y, x, c] = max_{i, j < window} pad(x, -inf)[n, y*stride + i, x*stride + j, c]. Windows
    that tile the input (stride = window, no padding) are a reshape + max (fastest inside a
    scanned training step on CPU); others an elementwise maximum of shifted slices (~10x faster
    there than ``lax.reduce_window``).
    """
    stride = stride or window
    if stride == window and padding == 0:
        n, h, w, c = x.shape
        h, w = h // window * window, w // window * window
        x = x[:, :h, :w, :].reshape(n, h // window, window, w // window, window, c)
        return x.max(axis=(2, 4))
    x = jnp.pad(x, ((0, 0), (padding, padding), (padding, padding), (0, 0)),
                constant_values=-jnp.inf)
    height = (x.shape[1] - window) // stride + 1
    width = (x.shape[2] - window) // stride + 1
    return functools.reduce(jnp.maximum, [
        x[:, i:i + stride * (height - 1) + 1:stride, j:j + stride * (width - 1) + 1:stride, :]
        for i in range(window) for j in range(window)])


def torch_kernel_init():
    """PyTorch's default Linear/Conv weight init: U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    return jax.nn.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform")


def torch_bias_init(fan_in: int):
    """PyTorch's default bias init: U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    bound = 1.0 / math.sqrt(fan_in)

    def init(key, shape: Sequence[int], dtype=jnp.float32):
        return jax.random.uniform(key, shape, dtype, -bound, bound)

    return init


def kaiming_normal(mode: str):
    """PyTorch's ``kaiming_normal_(mode=mode, nonlinearity='relu')``: N(0, 2 / fan)."""
    return jax.nn.initializers.variance_scaling(2.0, mode, "normal")


def conv(features: int, kernel: int, impl: str, name: str, *, stride: int = 1, padding: int = 0,
         kernel_init=None, bias_init=None) -> nn.Conv:
    """torch ``Conv2d(kernel, stride, padding)`` in NHWC on the ``impl`` primitive.

    The kernel defaults to PyTorch's default init; there is no bias when ``bias_init`` is None.
    """
    return nn.Conv(features, (kernel, kernel), strides=(stride, stride),
                   padding=padding or "VALID",
                   use_bias=bias_init is not None, kernel_init=kernel_init or torch_kernel_init(),
                   bias_init=bias_init or nn.initializers.zeros,
                   conv_general_dilated=conv_function(impl), name=name)


def conv1d(features: int, kernel: int, fan_in: int, impl: str, name: str, *, stride: int = 1,
           padding: int = 0) -> nn.Conv:
    """torch ``Conv1d(kernel, stride, padding)`` with its default init, applied to a signal laid
    out as [N, L, 1, C]: a (kernel x 1) 2-D convolution, so the im2col primitive serves it too.
    ``fan_in`` is in_channels * kernel (the bias init's bound)."""
    return nn.Conv(features, (kernel, 1), strides=(stride, 1),
                   padding=((padding, padding), (0, 0)), kernel_init=torch_kernel_init(),
                   bias_init=torch_bias_init(fan_in), conv_general_dilated=conv_function(impl),
                   name=name)


def dense(features: int, fan_in: int, name: str, kernel_init=None) -> nn.Dense:
    """torch ``Linear(fan_in, features)``; the kernel defaults to PyTorch's default init."""
    return nn.Dense(features, kernel_init=kernel_init or torch_kernel_init(),
                    bias_init=torch_bias_init(fan_in), name=name)


def group_norm(name: str, groups: int = 2) -> nn.GroupNorm:
    """torch ``GroupNorm(groups, C)``: learnable per-channel scale (1) and bias (0), eps 1e-5."""
    return nn.GroupNorm(num_groups=groups, epsilon=1e-5, name=name)


class BatchNorm(nn.Module):
    """torch ``BatchNorm1d/2d(C)`` (affine, momentum 0.1, eps 1e-5) over every axis but the last.

    Training, on the n values per channel of the real examples (``mask``: [B] or [B, ...] over
    the leading axes; None: all):
        mu = mean(x),  v = mean((x - mu)^2),  y = (x - mu) / sqrt(v + eps) * scale + bias
        running_mean <- (1 - m) running_mean + m mu
        running_var  <- (1 - m) running_var + m v n / (n - 1)      (torch: unbiased)
    Evaluation: y = (x - running_mean) / sqrt(running_var + eps) * scale + bias.
    The running statistics are the ``batch_stats`` collection: fljax carries them as model state.
    """

    momentum: float = 0.1
    epsilon: float = 1e-5

    @nn.compact
    def __call__(self, x, train: bool = False, mask=None):
        channels = x.shape[-1]
        scale = self.param("scale", nn.initializers.ones, (channels,))
        bias = self.param("bias", nn.initializers.zeros, (channels,))
        mean = self.variable("batch_stats", "mean", lambda: jnp.zeros(channels, scale.dtype))
        var = self.variable("batch_stats", "var", lambda: jnp.ones(channels, scale.dtype))
        if not train:
            mu, v = mean.value, var.value
        else:
            weight = jnp.ones(x.shape[:-1], x.dtype) if mask is None else jnp.broadcast_to(
                mask.astype(x.dtype).reshape(mask.shape + (1,) * (x.ndim - 1 - mask.ndim)),
                x.shape[:-1])
            axes = tuple(range(x.ndim - 1))
            n = jnp.maximum(weight.sum(), 1.0)
            mu = jnp.tensordot(weight, x, axes=(axes, axes)) / n
            v = jnp.tensordot(weight, jnp.square(x - mu), axes=(axes, axes)) / n
            if not self.is_initializing():
                m = self.momentum
                mean.value = ((1 - m) * mean.value + m * mu).astype(mean.value.dtype)
                unbiased = v * n / jnp.maximum(n - 1.0, 1.0)
                var.value = ((1 - m) * var.value + m * unbiased).astype(var.value.dtype)
        return (x - mu) * jax.lax.rsqrt(v + self.epsilon) * scale + bias
