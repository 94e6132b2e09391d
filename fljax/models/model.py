"""A model as fljax uses it: pure functions of explicit parameters, plus its layer order."""

from __future__ import annotations

import inspect
from typing import Any, Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from fljax.errors import FljaxError

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
                num_classes: int | None = None) -> Model:
    """Wrap any Flax module whose ``__call__(x, ...)`` returns logits as a Model.

    Optional keyword arguments of ``__call__`` are used when the module has them:

    - ``train: bool`` (or ``deterministic: bool``, its negation): training mode, e.g. dropout on;
      dropout draws from the ``'dropout'`` rng stream;
    - ``with_features: bool``: return ``(features, logits)``, the penultimate representation
      that MOON, FedDecorr and the feature probes need. A module without it still trains with
      every other algorithm; ``apply_with_features`` then raises a clear error.

    Floating inputs are cast to the dtype of the parameters, so a float64 model (e.g. built with
    ``param_dtype=jnp.float64`` under ``jax_enable_x64``) computes in float64 and a float32 model in
    float32 whatever the data's dtype. ``num_classes`` defaults to the width of the logits.
    """
    accepted = inspect.signature(module.__call__).parameters
    has_features = "with_features" in accepted

    def init(key):
        variables = module.init(key, jnp.zeros((1, *input_shape), jnp.float32))
        return variables["params"]

    def call(params, x, train, rng, with_features):
        leaf = jax.tree.leaves(params)[0]
        if jnp.issubdtype(x.dtype, jnp.floating) and jnp.issubdtype(leaf.dtype, jnp.floating):
            x = x.astype(leaf.dtype)
        kwargs = {}
        if "train" in accepted:
            kwargs["train"] = train
        elif "deterministic" in accepted:
            kwargs["deterministic"] = not train
        if with_features:
            kwargs["with_features"] = True
        rngs = {"dropout": rng} if rng is not None else {}
        return module.apply({"params": params}, x, rngs=rngs, **kwargs)

    def apply_with_features(params, x, train=False, rng=None):
        if not has_features:
            raise FljaxError(f"model {name!r} does not return features: give its __call__ a "
                             f"'with_features' argument that makes it return (features, logits)")
        return call(params, x, train, rng, with_features=True)

    def apply(params, x, train=False, rng=None):
        return call(params, x, train, rng, with_features=False)

    groups: list[str] = []

    def record_groups(key):  # the traced dict keeps creation order; eval_shape's result is sorted
        params = init(key)
        groups.extend(params)
        return params

    abstract = jax.eval_shape(record_groups, jax.random.key(0))
    if num_classes is None:
        num_classes = int(jax.eval_shape(apply, abstract,
                                         jnp.zeros((1, *input_shape), jnp.float32)).shape[-1])
    return Model(name, init, apply, apply_with_features, tuple(groups), tuple(input_shape),
                 num_classes)


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
