"""Which examples a client uses at each local step, as pure functions of a key (inside jit).

Local data is read in epochs, each a fresh random order of the client's n_i examples split into
ceil(n_i / B) batches, the last one smaller (PyTorch's ``DataLoader(shuffle=True, drop_last=False)``):
a padded slot carries mask 0. Step k of a client reads batch k mod ceil(n_i/B) of epoch
floor(k / ceil(n_i/B)), so a fixed number of steps K and a number of epochs E are the same loop.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def steps_per_epoch(count: jax.Array, batch_size: int) -> jax.Array:
    """ceil(n_i / B)."""
    return (count + batch_size - 1) // batch_size


def epoch_order(key: jax.Array, count: jax.Array, max_count: int) -> jax.Array:
    """A random permutation of [0, n_i) in the first n_i of ``max_count`` entries."""
    noise = jax.random.uniform(key, (max_count,))
    noise = jnp.where(jnp.arange(max_count) < count, noise, 2.0)
    return jnp.argsort(noise)


def epoch_order_at(key: jax.Array, count: jax.Array, step: jax.Array, batch_size: int,
                   max_count: int, previous: jax.Array) -> jax.Array:
    """The order used at local step ``step``: drawn at the first step of an epoch, else ``previous``.

    Carried through the scan over local steps, so the argsort runs once per epoch, not per step.
    """
    per_epoch = steps_per_epoch(count, batch_size)
    return jax.lax.cond(step % per_epoch == 0,
                        lambda: epoch_order(jax.random.fold_in(key, step // per_epoch), count,
                                            max_count).astype(previous.dtype),
                        lambda: previous)


def batch_from_order(order: jax.Array, count: jax.Array, step: jax.Array, batch_size: int,
                     max_count: int) -> tuple[jax.Array, jax.Array]:
    """Positions (``[B] int32``, indexing ``0..n_i-1``) of step ``step``'s batch, and its mask."""
    within = step % steps_per_epoch(count, batch_size)
    slots = within * batch_size + jnp.arange(batch_size)
    mask = slots < count
    positions = order[jnp.minimum(slots, max_count - 1)]
    return positions.astype(jnp.int32), mask


def client_batch(key: jax.Array, count: jax.Array, step: jax.Array, batch_size: int,
                 max_count: int) -> tuple[jax.Array, jax.Array]:
    """``batch_from_order`` for a single step, drawing its epoch's order afresh."""
    epoch = step // steps_per_epoch(count, batch_size)
    order = epoch_order(jax.random.fold_in(key, epoch), count, max_count)
    return batch_from_order(order, count, step, batch_size, max_count)
