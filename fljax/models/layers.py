"""Layers that run at full speed inside ``lax.scan`` on every backend.

XLA's CPU convolution takes a slow path inside a while loop (jax issue 12868): a local-training
``lax.scan`` of a small CNN runs ~15x slower than the same steps unrolled. Written as im2col
(shifted slices concatenated on the channel axis) followed by one matmul it does not. Both
implementations share parameters and layout, so a model can switch between them freely.
"""

from __future__ import annotations

import math
from typing import Sequence

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


def default_conv_impl() -> str:
    """im2col on CPU (XLA's CPU conv is slow inside scan), XLA's native conv on GPU/TPU."""
    return "im2col" if jax.default_backend() == "cpu" else "xla"


def max_pool(x, window: int = 2):
    """Non-overlapping max pooling (stride = window, floor mode) as a reshape + max."""
    n, h, w, c = x.shape
    h, w = h // window * window, w // window * window
    x = x[:, :h, :w, :].reshape(n, h // window, window, w // window, window, c)
    return x.max(axis=(2, 4))


def torch_kernel_init():
    """PyTorch's default Linear/Conv weight init: U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    return jax.nn.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform")


def torch_bias_init(fan_in: int):
    """PyTorch's default bias init: U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    bound = 1.0 / math.sqrt(fan_in)

    def init(key, shape: Sequence[int], dtype=jnp.float32):
        return jax.random.uniform(key, shape, dtype, -bound, bound)

    return init
