"""QSGD: Alistarh et al., "QSGD: Communication-Efficient SGD via Gradient Quantization and
Encoding", NeurIPS 2017 (Section 3.1).

The vector is cut into buckets of ``bucket_size`` consecutive coordinates (the whole tensor when
None); for a bucket v with s ``levels`` and l = floor(s |v_j| / ||v||_2),

    Q_s(v_j) = ||v||_2 sgn(v_j) xi_j / s,   xi_j = l + 1 with probability s |v_j| / ||v||_2 - l,
                                             else l,

so E[Q_s(v)] = v (unbiased), with variance at most min(d/s^2, sqrt(d)/s) ||v||^2 per bucket of d.
s = 1 is the paper's one-bit-per-magnitude case: each coordinate is 0 or +-||v||.

Encoding (fixed-width, the paper's Section 3.1 before Elias coding): each bucket sends its norm
(one float), and each coordinate one symbol sgn(v_j) xi_j of the 2s + 1 in {-s, ..., s}:

    bits = ceil(d / bucket_size) value_bits + d ceil(log2(2 s + 1)).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fljax.compression.base import Compressor, check_count, symbol_bits


def stochastic_round(r: jax.Array, key: jax.Array) -> jax.Array:
    """floor(r) + 1 with probability r - floor(r), else floor(r): unbiased, E = r."""
    low = jnp.floor(r)
    return low + (jax.random.uniform(key, r.shape, r.dtype) < r - low)


def qsgd(levels: int, bucket_size: int | None = None) -> Compressor:
    """QSGD with s = ``levels`` and buckets of ``bucket_size`` coordinates (None: one bucket)."""
    levels = check_count("levels", levels, 1)
    if bucket_size is not None:
        bucket_size = check_count("bucket_size", bucket_size, 1)

    def size(d):
        return d if bucket_size is None else min(bucket_size, d)

    def encode(x, key, shared_key):
        del shared_key
        d, b = x.shape[0], size(x.shape[0])
        buckets = jnp.pad(x, (0, -d % b)).reshape(-1, b)
        norm = jnp.linalg.norm(buckets, axis=1, keepdims=True)
        safe = jnp.where(norm > 0, norm, 1)
        xi = stochastic_round(levels * jnp.abs(buckets) / safe, key)
        decoded = norm * jnp.sign(buckets) * xi / levels
        return decoded.reshape(-1)[:d].astype(x.dtype)

    def bits(d, value_bits):
        return -(-d // size(d)) * value_bits + d * symbol_bits(2 * levels + 1)

    name = f"qsgd({levels}{'' if bucket_size is None else f', bucket {bucket_size}'})"
    return Compressor(name, encode, bits, unbiased=True)
