"""Sparsification: top-k (Stich et al., "Sparsified SGD with Memory", NeurIPS 2018; Aji and
Heafield 2017) and random-k.

top-k keeps the k = ceil(ratio d) coordinates of largest |x_j|, zeros elsewhere; it is biased and
is used with error feedback. Its encoding sends each kept value and its index:

    bits = k (value_bits + ceil(log2 d)).

random-k keeps k coordinates drawn uniformly without replacement from the client's key, scaled by
d / k when ``unbiased`` (then E[C(x)] = x). The server regenerates the coordinates from the seed,
so the encoding is the k values and one 32-bit seed:

    bits = k value_bits + 32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fljax.compression.base import Compressor, check_ratio, index_bits, kept
from fljax.errors import FljaxError

SEED_BITS = 32


def scatter(x: jax.Array, idx: jax.Array, scale=1.0) -> jax.Array:
    """``scale x_j`` at the coordinates ``idx``, 0 elsewhere."""
    return jnp.zeros_like(x).at[idx].set((scale * x[idx]).astype(x.dtype))


def top_k(ratio: float) -> Compressor:
    """Keep the ceil(ratio d) largest-magnitude coordinates (ties: the lower index)."""
    ratio = check_ratio(ratio)

    def encode(x, key, shared_key):
        del key, shared_key
        _, idx = jax.lax.top_k(jnp.abs(x), kept(ratio, x.shape[0]))
        return scatter(x, idx)

    return Compressor(f"top_k({ratio:g})", encode,
                      lambda d, value_bits: kept(ratio, d) * (value_bits + index_bits(d)),
                      unbiased=False)


def random_k(ratio: float, unbiased: bool = False) -> Compressor:
    """Keep ceil(ratio d) coordinates drawn uniformly without replacement (scaled by d / k if
    ``unbiased``)."""
    ratio = check_ratio(ratio)
    if not isinstance(unbiased, bool):
        raise FljaxError(f"unbiased must be true or false, got {unbiased!r}")

    def encode(x, key, shared_key):
        del shared_key
        d = x.shape[0]
        k = kept(ratio, d)
        # a uniform k-subset, drawn in float32 whatever the run's dtype: the same coordinates
        _, idx = jax.lax.top_k(jax.random.uniform(key, (d,), jnp.float32), k)
        return scatter(x, idx, d / k if unbiased else 1.0)

    return Compressor(f"random_k({ratio:g}{', unbiased' if unbiased else ''})", encode,
                      lambda d, value_bits: kept(ratio, d) * value_bits + SEED_BITS,
                      unbiased=unbiased)
