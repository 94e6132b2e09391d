"""Byzantine robustness: aggregation rules over the cohort's stacked messages, and attacks.

Modules:

- ``aggregators``: pure functions of an m x d matrix of messages (coordinate-wise median, trimmed
  mean, Krum, Multi-Krum, Bulyan, geometric median, centered clipping; the pre-aggregators NNM,
  bucketing and ARC), each with its equation and its paper.
- ``attacks``: what Byzantine clients send (sign flip, Gaussian, ALIE, IPM, mimic) and label
  flipping.

The wrappers that put them in a round are ``fljax.algorithms.robust`` and
``fljax.algorithms.byzantine``. Layer: may import ``fljax.errors`` only.
"""
