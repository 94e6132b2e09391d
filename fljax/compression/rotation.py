"""Uniform b-bit quantization after a random Hadamard rotation: Suresh et al., "Distributed Mean
Estimation with Limited Communication", ICML 2017 (pi_srk, Section 4), the scheme of TensorFlow
Federated's and FedJAX's encoders.

The tensor x in R^d is padded with zeros to d' = 2^ceil(log2 d) and rotated,

    z = H D x / sqrt(d'),

H the d' x d' Walsh-Hadamard matrix, D a diagonal of random signs drawn from the round's shared
key (every client of a round uses the same rotation; the server knows it, so it costs no bits).
Each z_j is rounded stochastically to one of the 2^b levels spaced evenly on [min z, max z]
(unbiased), and the server inverts the rotation, x^ = D H z^ / sqrt(d') (first d entries). E[x^]
= x. The encoding sends the b-bit level of every rotated coordinate and the two endpoints:

    bits = d' b + 2 value_bits.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fljax.compression.base import Compressor, check_count
from fljax.compression.qsgd import stochastic_round


def walsh_hadamard(x: jax.Array) -> jax.Array:
    """H x for the d' x d' Walsh-Hadamard matrix (Sylvester's order, entries +-1), d' = len(x) a
    power of two: log2 d' butterflies (a_j, a_j+h) -> (a_j + a_j+h, a_j - a_j+h)."""
    n, h = x.shape[0], 1
    while h < n:
        pairs = x.reshape(-1, 2, h)
        x = jnp.stack([pairs[:, 0] + pairs[:, 1], pairs[:, 0] - pairs[:, 1]], axis=1).reshape(n)
        h *= 2
    return x


def padded(d: int) -> int:
    """d' = 2^ceil(log2 d)."""
    return 1 << (d - 1).bit_length()


def rotated_uniform(bits: int) -> Compressor:
    """pi_srk with 2^``bits`` levels."""
    bits = check_count("bits", bits, 1)
    top = 2 ** bits - 1

    def encode(x, key, shared_key):
        d = x.shape[0]
        n = padded(d)
        signs = jax.random.rademacher(shared_key, (n,), x.dtype)
        z = walsh_hadamard(signs * jnp.pad(x, (0, n - d))) / jnp.sqrt(n).astype(x.dtype)
        low, high = z.min(), z.max()
        step = jnp.where(high > low, (high - low) / top, 1)
        level = stochastic_round((z - low) / step, key)
        quantized = low + level * step
        return (signs * walsh_hadamard(quantized) / jnp.sqrt(n).astype(x.dtype))[:d].astype(
            x.dtype)

    return Compressor(f"rotated_uniform({bits} bits)", encode,
                      lambda d, value_bits: padded(d) * bits + 2 * value_bits, unbiased=True)
