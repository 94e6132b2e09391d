"""Jitted, batched evaluation of a model on a fixed test set (compiled once, reused every call)."""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fljax.data.federated import as_device_inputs
from fljax.models.model import Model, Params, label_weights


def batch_scores(model: Model, params: Params, x, y: jax.Array,
                 mask: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(number correct, summed cross-entropy, number scored) of ``params`` over the scored labels
    of the examples where mask is 1 (one label per example, or one per position; -1: none)."""
    logits = model.apply(params, x)
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.maximum(y, 0))
    weights = label_weights(y, mask, losses.dtype)
    correct = jnp.sum((logits.argmax(-1) == y) * weights)
    return correct, jnp.sum(losses * weights), weights.sum()


def make_evaluator(model: Model, x, y: np.ndarray, batch_size: int = 1024,
                   like: Callable | None = None) -> Callable[[Params], dict[str, jax.Array]]:
    """``evaluate(params) -> {'accuracy', 'loss'}`` over all of (x, y), scanned in fixed batches:
    the accuracy and mean loss over every scored label (one per example, or per position).

    ``x`` is an array or a dict of arrays with a leading example axis. The data is padded once
    to a multiple of the batch; padded examples carry zero weight. ``like``: an evaluator of the
    same model whose compiled program this one shares (the data are its arguments).
    """
    n = len(y)
    batch_size = min(batch_size, n)
    num_batches = -(-n // batch_size)
    pad = num_batches * batch_size - n

    def batched(a):
        a = np.concatenate([a, np.zeros((pad, *a.shape[1:]), a.dtype)])
        return a.reshape(num_batches, batch_size, *a.shape[1:])

    x_b = as_device_inputs(jax.tree.map(batched, x))
    y_b = jnp.asarray(batched(np.asarray(y)), jnp.int32)
    mask_b = (jnp.arange(num_batches * batch_size) < n).reshape(num_batches, batch_size)

    @jax.jit
    def evaluate(params, x_b, y_b, mask_b):
        def body(totals, batch):
            return jax.tree.map(jnp.add, totals, batch_scores(model, params, *batch)), None

        zero = jnp.zeros((), jax.tree.leaves(params)[0].dtype)
        (correct, loss, scored), _ = jax.lax.scan(body, (zero, zero, zero), (x_b, y_b, mask_b))
        scored = jnp.maximum(scored, 1.0)
        return {"accuracy": correct / scored, "loss": loss / scored}

    program = evaluate if like is None else like.func
    return functools.partial(program, x_b=x_b, y_b=y_b, mask_b=mask_b)
