"""A client's work in a round: what it knows (ClientContext), its local training, its full local
gradient, and the cohort mapped in chunks with its messages summed.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fljax.algorithms.base import ClientContext, Params
from fljax.data.batching import batch_from_order, epoch_order_at, steps_per_epoch
from fljax.algorithms.transforms import freeze
from fljax.data.federated import FederatedData, take
from fljax.models.model import Model, cast_inputs, cross_entropy


class LocalWork(NamedTuple):
    """Static facts of local training, fixed when the round is built."""

    batch: int                 # B (the largest client's n_i for full-batch FedSGD)
    local_steps: int | None    # K steps for every client, or
    local_epochs: int | None   # E epochs: E * ceil(n_i / B) steps for client i
    max_steps: int             # the scan's length: the most steps any client takes
    max_count: int             # the largest n_i
    num_clients: int           # N
    mean_examples: float       # mean of n_j over all N clients
    unroll: int = 1            # local steps per iteration of the scan over steps (lax.scan's)


def model_loss(model: Model, compute_dtype=None) -> Callable:
    """``loss(params, x, y, mask, rng)``: the model's masked mean cross-entropy in training mode
    (over every scored label: one per example, or one per position).

    With ``compute_dtype`` (e.g. bfloat16) the forward and backward passes run in it: floating
    parameters and inputs are cast to it, the logits back to float32 before the loss, so the
    gradients (and the optimizer's state) keep the parameters' dtype."""
    def loss(params, x, y, mask, rng):
        if compute_dtype is not None:
            params = jax.tree.map(lambda p: p.astype(compute_dtype)
                                  if jnp.issubdtype(p.dtype, jnp.floating) else p, params)
            x = cast_inputs(x, params)
        logits = model.apply(params, x, train=True, rng=rng, mask=mask)
        if compute_dtype is not None:
            logits = logits.astype(jnp.float32)
        return cross_entropy(logits, y, mask)

    return loss


def full_gradient(loss_fn: Callable, data: FederatedData, count: jax.Array, offset: jax.Array,
                  params: Params, batch: int, max_count: int) -> Params:
    """grad of (1/n_i) sum_j loss(x_j) over the client holding ``data.index[offset:offset +
    count]``: its examples in order, in batches of B, without dropout (rng None)."""
    def body(total, b):
        slots = b * batch + jnp.arange(batch)
        mask = slots < count
        ids = data.index[offset + jnp.minimum(slots, count - 1)]
        scale = mask.sum() / count
        grads = jax.grad(loss_fn)(params, take(data.x, ids), data.y[ids], mask, None)
        return jax.tree.map(lambda t, g: t + scale * g, total, grads), None

    zeros = jax.tree.map(jnp.zeros_like, params)
    total, _ = jax.lax.scan(body, zeros, jnp.arange(-(-max_count // batch)))
    return total


def client_steps(work: LocalWork, counts: jax.Array) -> jax.Array:
    """Local steps of clients with ``counts`` examples: K, or E * ceil(n_i / B)."""
    if work.local_steps is not None:
        return jnp.full(jnp.shape(counts), work.local_steps, jnp.int32)
    return (work.local_epochs * steps_per_epoch(counts, work.batch)).astype(jnp.int32)


def client_context(work: LocalWork, loss_fn: Callable, data: FederatedData, data_row, client_id,
                   client_state, weight, params, server_state, round_index, cohort_size,
                   cohort_message=(), own_message=()) -> ClientContext:
    """What client ``client_id``, whose examples are client ``data_row`` of ``data``, knows in a
    round (see ClientContext)."""
    count = data.count[data_row]
    offset = data.offset[data_row]
    per_epoch = steps_per_epoch(count, work.batch)
    num_steps = client_steps(work, count)

    def gradient_at(at_params):
        return full_gradient(loss_fn, data, count, offset, at_params, work.batch, work.max_count)

    return ClientContext(params=params, server_state=server_state, client_state=client_state,
                         round=round_index, client_id=client_id, weight=weight,
                         cohort_size=cohort_size, num_clients=work.num_clients,
                         num_examples=count,
                         mean_examples=jnp.asarray(work.mean_examples,
                                                   jax.tree.leaves(params)[0].dtype),
                         num_steps=jnp.asarray(num_steps, jnp.int32), max_steps=work.max_steps,
                         steps_per_epoch=per_epoch, full_gradient=gradient_at,
                         cohort_message=cohort_message, own_message=own_message)


def local_training(loss_fn: Callable, tx: optax.GradientTransformation, start: Params,
                   data: FederatedData, client: jax.Array, batch_key: jax.Array,
                   step_key: jax.Array, *, num_steps: jax.Array, max_steps: int, batch: int,
                   max_count: int, augment: Callable | None = None,
                   model: Model | None = None, unroll: int = 1) -> tuple[Params, jax.Array]:
    """(the client's model after ``num_steps`` steps of ``tx`` on ``loss_fn`` from ``start``, each
    step's loss). Step k reads batch k of the client's shuffled epochs (``fljax.data.batching``);
    the scan runs ``max_steps`` steps, ``unroll`` of them per loop iteration, and steps
    k >= num_steps change nothing (loss 0).

    A ``model`` with state (BatchNorm) has its state leaves held out of ``tx`` (``freeze``) and
    set at each step by the training forward pass at y_k (``Model.update_state``), as torch
    updates running statistics in the forward pass before the optimizer step."""
    count, offset = data.count[client], data.offset[client]
    grad_fn = jax.value_and_grad(loss_fn)
    stateful = model is not None and model.state_mask is not None
    if stateful:
        tx = freeze(tx, model.state_mask)

    def step(carry, k):
        local, opt_state, order = carry
        order = epoch_order_at(batch_key, count, k, batch, max_count, order)
        positions, mask = batch_from_order(order, count, k, batch, max_count)
        ids = data.index[offset + positions]
        x, y = take(data.x, ids), data.y[ids]
        rng = jax.random.fold_in(step_key, k)
        if augment is not None:
            x = augment(jax.random.fold_in(rng, 1), x)
        loss, grads = grad_fn(local, x, y, mask, rng)
        updates, new_opt_state = tx.update(grads, opt_state, local)
        new_local = optax.apply_updates(local, updates)
        if stateful:
            observed = model.update_state(local, x, rng, mask)
            new_local = jax.tree.map(lambda is_state, a, b: a if is_state else b,
                                     model.state_mask, observed, new_local)
        active = k < num_steps
        keep = lambda new, old: jnp.where(active, new, old)
        carry = (jax.tree.map(keep, new_local, local),
                 jax.tree.map(keep, new_opt_state, opt_state), order)
        return carry, jnp.where(active, loss, 0.0)

    first = (start, tx.init(start), jnp.zeros(max_count, jnp.int32))
    (end, _, _), losses = jax.lax.scan(step, first, jnp.arange(max_steps), unroll=unroll)
    return end, losses


def map_sum(fn: Callable, inputs: Any, chunk: int, idle: Callable | None = None):
    """Apply ``fn`` to each row of ``inputs`` in chunks of ``chunk`` rows (vmap inside a scan over
    chunks); return (stacked first outputs, SUM over rows of the second output, stacked third).

    With ``idle`` (fn's outputs for a row that does no work), ``inputs[-1]`` is each row's active
    flag and a chunk without an active row calls ``idle`` instead (``lax.cond``: it costs nothing).
    """
    rows = jax.tree.leaves(inputs)[0].shape[0]
    one = jax.tree.map(lambda a: a[0], inputs)
    _, msg_shape, _ = jax.eval_shape(fn, *one)
    total = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), msg_shape)
    per_chunk = (lambda *xs: fn(*xs)) if chunk == 1 else jax.vmap(fn)

    def body(acc, xs):
        if chunk == 1:
            xs = jax.tree.map(lambda a: a[0], xs)
        if idle is None:
            state, msg, metrics = per_chunk(*xs)
        else:
            rest = idle if chunk == 1 else jax.vmap(idle)
            state, msg, metrics = jax.lax.cond(jnp.any(xs[-1]), lambda: per_chunk(*xs),
                                               lambda: rest(*xs))
        if chunk == 1:
            state, metrics = jax.tree.map(lambda a: a[None], (state, metrics))
        else:
            # A contraction with ones: XLA:CPU reduces a vmapped axis with sum() ~3x slower.
            msg = jax.tree.map(lambda a: jnp.tensordot(jnp.ones(chunk, a.dtype), a, axes=1), msg)
        return jax.tree.map(jnp.add, acc, msg), (state, metrics)

    chunks = jax.tree.map(lambda a: a.reshape(rows // chunk, chunk, *a.shape[1:]), inputs)
    total, (states, metrics) = jax.lax.scan(body, total, chunks)
    unchunk = lambda a: a.reshape(rows, *a.shape[2:])
    return jax.tree.map(unchunk, states), total, jax.tree.map(unchunk, metrics)


def joined_only(fn: Callable, inputs: Any, state_at: int | None, active: bool):
    """(fn, idle) for map_sum over ``inputs`` whose last entry is each row's joined flag: fn's
    outputs where the client joined, else idle's: its state unchanged (the row's entry
    ``state_at``; None: zeros), zero message and metrics. Without ``active`` (uniform cohorts)
    every row joined."""
    if not active:
        return fn, None
    state_shape, message_shape, metrics_shape = jax.eval_shape(
        fn, *jax.tree.map(lambda a: a[0], inputs))      # traced once, not per use of idle
    zeros = lambda tree: jax.tree.map(lambda t: jnp.zeros(t.shape, t.dtype), tree)

    def idle(*row):
        return (zeros(state_shape) if state_at is None else row[state_at],
                zeros(message_shape),
                zeros(metrics_shape))

    def masked(*row):   # a select, not a product: an idle slot's NaN never leaks
        return jax.tree.map(lambda a, b: jnp.where(row[-1], a, b), fn(*row), idle(*row))

    return masked, idle
