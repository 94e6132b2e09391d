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
        return jax.tree.map(lambda g, y, a: (g + mu * (y - a)).astype(g.dtype), updates, params,
                            anchor), state

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


def keep_frozen_state(new_state: Any, old_state: Any, frozen: Params) -> Any:
    """``new_state`` with every params-shaped part reset to ``old_state`` on frozen leaves."""
    params_def = jax.tree.structure(frozen)

    def params_like(node):
        return jax.tree.structure(node) == params_def

    def pick(new, old):
        if params_like(new):
            return jax.tree.map(lambda f, n, o: jnp.where(f, o, n), frozen, new, old)
        return new

    return jax.tree.map(pick, new_state, old_state, is_leaf=params_like)


def frozen_update(tx: optax.GradientTransformationExtraArgs, grads: Params, state: Any,
                  params: Params, frozen: Params, **extra_args):
    """One update of ``tx`` holding the leaves marked True in ``frozen`` still, as torch treats a
    parameter without ``.grad`` (or a buffer):

        g <- 0 on frozen leaves;  u, s' = tx.update(g, s, y, frozen=frozen)
        u <- 0 on frozen leaves (no weight decay, linear or proximal term moves them)
        s' <- s on frozen leaves, for every params-shaped part of the state (momentum buffers)
    """
    zero = lambda f, x: jnp.where(f, jnp.zeros_like(x), x)
    grads = jax.tree.map(zero, frozen, grads)
    updates, new_state = tx.update(grads, state, params, frozen=frozen, **extra_args)
    return jax.tree.map(zero, frozen, updates), keep_frozen_state(new_state, state, frozen)


def freeze(tx: optax.GradientTransformation, frozen: Params
           ) -> optax.GradientTransformationExtraArgs:
    """``tx`` that never moves the leaves marked True in the static tree ``frozen``
    (``frozen_update``), nor those marked in a ``frozen=`` given to its update: a model's state
    (BatchNorm statistics), set by the forward pass instead."""
    tx = optax.with_extra_args_support(tx)

    def update(updates, state, params=None, *, frozen=None, **extra_args):
        mask = static if frozen is None else jax.tree.map(jnp.logical_or, static, frozen)
        return frozen_update(tx, updates, state, params, mask, **extra_args)

    static = frozen
    return optax.GradientTransformationExtraArgs(tx.init, update)
