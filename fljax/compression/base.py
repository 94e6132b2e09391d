"""The compressor interface: how one tensor of a client's message is encoded, and its size in bits.

A ``Compressor`` encodes a flat vector x in R^d and returns what the server decodes, C(x) (also in
R^d), together with the exact size of the encoding in bits as the compressor's paper defines it
(``bits(d, value_bits)``: values, indices, norms and seeds; ``value_bits`` is the width of one
floating value of the message, 32 for float32). Every tensor (pytree leaf) of a message is encoded
on its own, as TensorFlow Federated's and FedJAX's encoders do, so the scales of different layers
and of different parts of a message (SCAFFOLD's update and control variate) never mix.

Randomness: ``encode(x, key, shared_key)``: ``key`` is the client's own (stochastic rounding, the
random coordinates), ``shared_key`` is the same for every client of a round (public randomness,
such as a random rotation the server inverts) and costs no bits.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import jax

from fljax.errors import FljaxError


class Compressor(NamedTuple):
    """One tensor's encoding: ``encode(x [d], key, shared_key) -> C(x) [d]`` (the decoded vector);
    ``bits(d, value_bits) -> int``, its exact size; ``unbiased``: whether E[C(x)] = x."""

    name: str
    encode: Callable[[jax.Array, jax.Array, jax.Array], jax.Array]
    bits: Callable[[int, int], int]
    unbiased: bool


def index_bits(d: int) -> int:
    """ceil(log2 d): the bits of one coordinate index among d (0 for d = 1)."""
    return (d - 1).bit_length()


def symbol_bits(count: int) -> int:
    """ceil(log2 count): the bits of a fixed-width code for one of ``count`` symbols."""
    return (count - 1).bit_length()


def kept(ratio: float, d: int) -> int:
    """k = ceil(ratio d), at least 1: the coordinates a sparsifier keeps of d."""
    return max(1, min(d, math.ceil(round(ratio * d, 9))))   # 0.07 * 100 is 7, not 7.000...1


def check_ratio(ratio) -> float:
    """A share of coordinates in (0, 1] (a Python number: it sets k, a shape)."""
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
        raise FljaxError(f"ratio must be a number in (0, 1] (the share of coordinates kept), "
                         f"got {ratio!r}")
    return float(ratio)


def check_count(name: str, value, least: int) -> int:
    """A whole number >= ``least`` (a Python int: it sets a code's width)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise FljaxError(f"{name} must be a whole number >= {least}, got {value!r}")
    return value
