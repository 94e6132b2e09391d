"""Small optax transformations that client-drift corrections are built from.

Each adds the gradient of a term of the local objective, so it goes in ``LocalSGD.chain``'s
``loss_terms`` (clipped with the loss gradient, as the reference code's in-loss terms are).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

Params = Any


def add_constant(tree: Params) -> optax.GradientTransformation:
    """g <- g + tree: the gradient of the linear term <y, tree> (SCAFFOLD's c - c_i, FedDyn's
    -grad L_i(y_i^{t-1}) - alpha * w)."""

    def update(updates, state, params=None):
        del params
        return jax.tree.map(lambda g, c: g + c.astype(g.dtype), updates, tree), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def add_proximal(mu: float | jax.Array, anchor: Params) -> optax.GradientTransformation:
    """g <- g + mu (y - anchor): the gradient of mu/2 ||y - anchor||^2 (FedProx)."""

    def update(updates, state, params=None):
        if params is None:
            raise ValueError("add_proximal needs the params in update()")
        return jax.tree.map(lambda g, y, a: g + mu * (y - a), updates, params, anchor), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def zero_frozen() -> optax.GradientTransformationExtraArgs:
    """g <- 0 on the leaves marked True in ``update(..., frozen=tree)``, the identity without it.

    ``LocalSGD.chain`` puts it after the in-loss terms, before the clip: FedBug passes its mask, so
    a frozen leaf's in-loss terms stay out of the clip norm, as torch leaves out a parameter
    without ``.grad``."""

    def update(updates, state, params=None, *, frozen=None, **extra_args):
        del params, extra_args
        if frozen is None:
            return updates, state
        return jax.tree.map(lambda f, g: jnp.where(f, jnp.zeros_like(g), g), frozen,
                            updates), state

    return optax.GradientTransformationExtraArgs(lambda params: optax.EmptyState(), update)
