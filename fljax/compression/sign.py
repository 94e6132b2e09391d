"""Scaled sign: Karimireddy et al., "Error Feedback Fixes SignSGD and other Gradient Compression
Schemes", ICML 2019 (Algorithm 1, EF-SIGNSGD, with error feedback).

    C(x) = (||x||_1 / d) sign(x)           (sign(0) = +1: one bit cannot say 0)

It is biased (EF-signSGD is this compressor under ``error_feedback``). The encoding is one bit per
coordinate and the scale:

    bits = d + value_bits.
"""

from __future__ import annotations

import jax.numpy as jnp

from fljax.compression.base import Compressor


def scaled_sign() -> Compressor:
    """(||x||_1 / d) sign(x)."""

    def encode(x, key, shared_key):
        del key, shared_key
        scale = jnp.sum(jnp.abs(x)) / x.shape[0]
        return jnp.where(x >= 0, scale, -scale).astype(x.dtype)

    return Compressor("scaled_sign", encode, lambda d, value_bits: d + value_bits,
                      unbiased=False)
