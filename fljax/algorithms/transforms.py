"""Small optax transformations that client-drift corrections are built from.

Each adds the gradient of a term of the local objective, so it goes in ``LocalSGD.chain``'s
``loss_terms`` (clipped with the loss gradient, as the reference code's in-loss terms are).
"""

from __future__ import annotations

import jax
import optax

from fljax.algorithms.base import Params


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
