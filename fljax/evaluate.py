"""Jitted, batched evaluation of a model on a fixed test set (compiled once, reused every call)."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from fljax.models.model import Model, Params, cross_entropy


def batch_scores(model: Model, params: Params, x: jax.Array, y: jax.Array,
                 mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(number correct, summed cross-entropy) of ``params`` over the examples where mask is 1."""
    logits = model.apply(params, x.astype(jax.tree.leaves(params)[0].dtype))
    correct = jnp.sum((logits.argmax(-1) == y) * mask)
    return correct, cross_entropy(logits, y, mask) * mask.sum()


def make_evaluator(model: Model, x: np.ndarray, y: np.ndarray, batch_size: int = 1024
                   ) -> Callable[[Params], dict[str, jax.Array]]:
    """``evaluate(params) -> {'accuracy', 'loss'}`` over all of (x, y), scanned in fixed batches.

    The data is padded once to a multiple of the batch; padded examples carry zero weight.
    """
    n = len(y)
    batch_size = min(batch_size, n)
    num_batches = -(-n // batch_size)
    pad = num_batches * batch_size - n
    float_dtype = jax.dtypes.canonicalize_dtype(jnp.float64)  # float32 unless x64 is on
    x_b = jnp.asarray(np.concatenate([x, np.zeros((pad, *x.shape[1:]), x.dtype)]),
                      float_dtype).reshape(num_batches, batch_size, *x.shape[1:])
    y_b = jnp.asarray(np.concatenate([y, np.zeros(pad, y.dtype)]), jnp.int32).reshape(
        num_batches, batch_size)
    mask_b = (jnp.arange(num_batches * batch_size) < n).reshape(num_batches, batch_size)

    @jax.jit
    def evaluate(params, x_b, y_b, mask_b):
        def body(totals, batch):
            correct, loss = batch_scores(model, params, *batch)
            return (totals[0] + correct, totals[1] + loss), None

        (correct, loss), _ = jax.lax.scan(body, (0.0, 0.0), (x_b, y_b, mask_b))
        return {"accuracy": correct / n, "loss": loss / n}

    return lambda params: evaluate(params, x_b, y_b, mask_b)
