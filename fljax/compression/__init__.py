"""Message compressors: each encodes one tensor of a client's message and counts its bits exactly
(``fljax.compression.base``); ``fljax.algorithms.compress`` puts one on any algorithm's uplink.

``make(name, **settings)`` builds one by name, as the config's ``compress`` wrapper names it:

- ``top_k`` (``ratio``), ``random_k`` (``ratio``, ``unbiased``): sparsification;
- ``qsgd`` (``levels``, ``bucket_size``): QSGD's stochastic quantization (s = 1: one bit per
  magnitude);
- ``scaled_sign``: (||x||_1 / d) sign(x), EF-signSGD's compressor;
- ``rotated_uniform`` (``bits``): b-bit uniform quantization after a random Hadamard rotation.
"""

from __future__ import annotations

import inspect

from fljax.compression.base import Compressor
from fljax.compression.qsgd import qsgd
from fljax.compression.rotation import rotated_uniform
from fljax.compression.sign import scaled_sign
from fljax.compression.sparsify import random_k, top_k
from fljax.errors import FljaxError

COMPRESSORS = {"top_k": top_k, "random_k": random_k, "qsgd": qsgd, "scaled_sign": scaled_sign,
               "rotated_uniform": rotated_uniform}


def make(name: str, **settings) -> Compressor:
    """The compressor ``name`` with ``settings`` (None values are left to its defaults)."""
    if name not in COMPRESSORS:
        raise FljaxError(f"unknown compressor {name!r}; allowed: {sorted(COMPRESSORS)}")
    factory = COMPRESSORS[name]
    takes = inspect.signature(factory).parameters
    given = {k: v for k, v in settings.items() if v is not None and v is not False}
    extra = sorted(set(given) - set(takes))
    if extra:
        raise FljaxError(f"compressor {name!r} does not take {extra}; its settings are "
                         f"{sorted(takes)}")
    missing = [p for p, spec in takes.items() if spec.default is spec.empty and p not in given]
    if missing:
        raise FljaxError(f"compressor {name!r} needs {missing}")
    return factory(**given)


__all__ = ["COMPRESSORS", "Compressor", "make", "qsgd", "random_k", "rotated_uniform",
           "scaled_sign", "top_k"]
