"""FedNTD: federated not-true distillation.

Lee, Jeong, Shin, Yun, "Preservation of the Global Knowledge by Not-True Distillation in Federated
Learning", NeurIPS 2022; official ``Lee-Gihun/FedNTD``, ``algorithms/fedntd/criterion.py``.

For a batch with labels y, the local model's logits l and the broadcast global model w^t's logits g
(no gradient; applied in eval mode, i.e. without dropout: the official models have none), drop
the true class's column (``refine_as_not_true``) and distil:

    q_l = softmax(l_{not y} / tau),  q_g = softmax(g_{not y} / tau)           (C - 1 classes)
    L   = CE(l, y) + beta * tau^2 * (1/N) sum_n KL(q_g,n || q_l,n)

with N the number of valid examples of the batch (torch's ``KLDivLoss(reduction='batchmean')``;
padded examples of a partial last batch contribute nothing). The server is FedAvg (any
``server_optimizer``).

Defaults: beta = 1, tau = 1 (``config/fedntd.json``; ``NTD_Loss``'s own default tau = 3 is not
used by it). The tau^2 factor is the repository's later criterion; an earlier commit omits it
(that equals beta / tau^2 here, and is identical at tau = 1). beta = 0 is FedAvg exactly.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from fljax.algorithms.base import Algorithm, ClientContext, ClientOptimizer, LocalSGD, LossFn
from fljax.algorithms.fedavg import fedavg
from fljax.hyperparams import NON_NEGATIVE, POSITIVE, check
from fljax.models.model import Model, cross_entropy


def not_true_logits(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Each row of ``logits`` [N, C] without its label's column: [N, C - 1], order kept."""
    others = jnp.arange(logits.shape[-1] - 1)
    columns = others[None, :] + (others[None, :] >= labels[:, None])
    return jnp.take_along_axis(logits, columns, axis=-1)


def not_true_kl(local_logits: jax.Array, global_logits: jax.Array, labels: jax.Array,
                mask: jax.Array, tau: float) -> jax.Array:
    """tau^2 * mean over valid examples of KL(softmax(g_{not y}/tau) || softmax(l_{not y}/tau))."""
    log_q_local = jax.nn.log_softmax(not_true_logits(local_logits, labels) / tau)
    log_q_global = jax.nn.log_softmax(not_true_logits(global_logits, labels) / tau)
    kl = jnp.sum(jnp.exp(log_q_global) * (log_q_global - log_q_local), axis=-1)
    mask = mask.astype(kl.dtype)
    return tau ** 2 * jnp.sum(kl * mask) / jnp.maximum(mask.sum(), 1.0)


def fedntd(local: LocalSGD | optax.GradientTransformation | ClientOptimizer, model: Model, *,
           beta: float = 1.0, tau: float = 1.0,
           server_optimizer: optax.GradientTransformation | None = None) -> Algorithm:
    """FedAvg whose clients distil the global model's not-true-class predictions."""
    check("beta", beta, NON_NEGATIVE, "a finite number >= 0")
    check("tau", tau, POSITIVE, "a finite number > 0")

    def client_loss(ctx: ClientContext, loss_fn: LossFn) -> LossFn:
        del loss_fn  # replaced by CE + the distillation term

        def loss(params, x, y, mask, rng):
            logits = model.apply(params, x, train=True, rng=rng)
            global_logits = jax.lax.stop_gradient(model.apply(ctx.params, x))
            return (cross_entropy(logits, y, mask)
                    + beta * not_true_kl(logits, global_logits, y, mask, tau))

        return loss

    return fedavg(local, server_optimizer, name="fedntd")._replace(client_loss=client_loss)
