"""A model as fljax uses it: pure functions of explicit parameters, plus its layer order."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

Params = Any


class Model(NamedTuple):
    """Pure functions around a Flax module.

    ``apply(params, x, train=False, rng=None) -> logits`` and
    ``apply_with_features(params, x, train=False, rng=None) -> (features, logits)``, where features
    are the penultimate representation (MOON, FedDecorr, feature analysis). ``groups`` names the
    top-level parameter groups in order from input to output (FedBug unfreezes them bottom-up).
    """

    name: str
    init: Callable[[jax.Array], Params]
    apply: Callable[..., jax.Array]
    apply_with_features: Callable[..., tuple[jax.Array, jax.Array]]
    groups: tuple[str, ...]
    input_shape: tuple[int, ...]
    num_classes: int


def from_module(name: str, module: nn.Module, input_shape: tuple[int, ...],
                num_classes: int) -> Model:
    """Wrap a module whose ``__call__(x, train, with_features)`` returns logits or (features, logits)."""

    def init(key):
        variables = module.init(key, jnp.zeros((1, *input_shape), jnp.float32))
        return variables["params"]

    def apply_with_features(params, x, train=False, rng=None):
        rngs = {"dropout": rng} if rng is not None else {}
        return module.apply({"params": params}, x, train=train, with_features=True, rngs=rngs)

    def apply(params, x, train=False, rng=None):
        return apply_with_features(params, x, train, rng)[1]

    groups: list[str] = []

    def record_groups(key):  # the traced dict keeps creation order; eval_shape's result is sorted
        params = init(key)
        groups.extend(params)
        return params

    jax.eval_shape(record_groups, jax.random.key(0))
    groups = tuple(groups)
    return Model(name, init, apply, apply_with_features, groups, tuple(input_shape), num_classes)


def cross_entropy(logits: jax.Array, labels: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """Mean softmax cross-entropy over the examples where ``mask`` is 1 (all when None)."""
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    if mask is None:
        return losses.mean()
    mask = mask.astype(losses.dtype)
    return (losses * mask).sum() / jnp.maximum(mask.sum(), 1.0)


def num_params(params: Params) -> int:
    """Total number of scalars in a parameter tree."""
    return sum(int(p.size) for p in jax.tree.leaves(params))
