"""FedGA (Federated Gradient Alignment), GradAlign, and the large-batch SGD baseline.

Dandi, Barba, Jaggi, "Implicit Gradient Alignment in Distributed and Federated Learning", AAAI 2022
(Algorithms 1-2); official code ``epfml/GradientAlignment``
(``interface.py:GradAlign``, ``lbsgd``; ``functions.py:compute_full_gradient``).

A round of FedGA takes two exchanges (``exchanges`` = 2; the official code counts both):

1. each sampled client i sends its full local gradient g_i(x) (mean loss over all its n_i examples,
   ``ctx.full_gradient``), and the server returns their n_i-weighted mean over the cohort

       gbar(x) = sum_{i in S} n_i g_i(x) / sum_{i in S} n_i

   (the official code's weighting, whatever the engine's aggregation; the paper writes 1/n for
   equal-sized clients);
2. client i is displaced and takes K local steps (Algorithm 2, lines 5-9):

       x_i,0 = x - beta (gbar(x) - g_i(x)),      x_i,k = x_i,k-1 - eta_l grad f_i(x_i,k-1; zeta_i,k)

   and the server is FedAvg's on the final models: x <- x + ServerOpt(sum_S p_i (x - x_i,K)). The
   official code averages the models without weights (aggregation='uniform') and applies torch SGD
   (server lr, default 1, optional momentum) to -(mean - x): ``server_optimizer``.

With aggregation='examples', p_i = n_i / sum_S n_j and the displacements cancel in the average
(sum_S p_i (gbar - g_i) = 0, Appendix A.5); with 'uniform' and clients of unequal size they leave
-beta (gbar - mean_S g_i) in the aggregate, as in the official code. beta = 0 is FedAvg exactly
(the gradients are still exchanged). The official defaults: beta = 0.1, K = 5, lr 0.01, wd 1e-3;
beta is not decayed (the decay line is commented out). g_i(x) is taken without dropout (the engine's
``full_gradient``), once per client and round: the client keeps the message it sent
(``ctx.own_message``) for its own displacement.

GradAlign (Algorithm 1, the datacenter form) is FedGA with K = 1: run ``gradalign`` with
``local_steps=1``, each "client" a mini-batch shard.

Large-batch SGD (``lbsgd``, the official baseline): one exchange per round in which the server
applies torch SGD (lr, weight decay, momentum; optional clipping of gbar) to gbar(x):

    x <- x - lr (clip(gbar(x)) + wd x)        (with momentum: torch's buffer on that sum)

This is ``fedsgd(lr)`` (one local sgd(1) step on the full local batch: x - x_i,1 = g_i(x)) with
that server optimizer; run it with ``batch_size=None, local_steps=1, aggregation='examples'``
(the n_i weights of gbar). Without weight decay, momentum or clipping it is ``fedsgd(lr)``.
"""

from __future__ import annotations

import jax
import optax

from fljax.registry import declare
from fljax.algorithms.base import (Algorithm, ClientContext, ClientOptimizer, LocalSGD, Params,
                                   local_sgd, tree_scale)
from fljax.algorithms.fedavg import fedavg
from fljax.hyperparams import NON_NEGATIVE, check


def gradient_exchange(ctx: ClientContext):
    """The first exchange of a round (a ``cohort_start``): (n_i g_i(x), n_i), g_i(x) the client's
    full local gradient at the broadcast model in the model's dtype. Summed over the cohort, their
    ratio is gbar(x) = sum_S n_i g_i(x) / sum_S n_i."""
    n = ctx.num_examples.astype(ctx.weight.dtype)
    local = jax.tree.map(lambda g, w: g.astype(w.dtype), ctx.full_gradient(ctx.params),
                         ctx.params)
    return tree_scale(n, local), n


def gradient_mismatch(ctx: ClientContext) -> Params:
    """gbar(x) - g_i(x) after ``gradient_exchange`` (the client keeps its own message)."""
    weighted_sum, total = ctx.cohort_message
    own_sum, n = ctx.own_message                                      # g_i(x) = n_i g_i(x) / n_i
    return jax.tree.map(lambda s, o: s / total - o / n, weighted_sum, own_sum)


@declare(aggregation="uniform")   # the paper's / official code's unweighted mean
def fedga(local: LocalSGD | optax.GradientTransformation | ClientOptimizer, beta: float = 0.1,
          server_optimizer: optax.GradientTransformation | None = None,
          *, name: str = "fedga") -> Algorithm:
    """FedGA with displacement ``beta`` on the local optimizer ``local`` (FedAvg's server)."""
    check("beta", beta, NON_NEGATIVE, "a finite number >= 0")

    def client_start(ctx: ClientContext, key: jax.Array) -> Params:
        del key
        return jax.tree.map(lambda w, d: (w - beta * d).astype(w.dtype), ctx.params,
                            gradient_mismatch(ctx))

    return fedavg(local, server_optimizer, name=name)._replace(
        cohort_start=gradient_exchange, client_start=client_start,
        exchanges=lambda round_index: 2,
        payload=lambda round_index: (2, 2))     # x, then gbar down; g_i(x), then x_i,K up


def gradalign(local: LocalSGD | optax.GradientTransformation | ClientOptimizer,
              beta: float = 0.1,
              server_optimizer: optax.GradientTransformation | None = None) -> Algorithm:
    """GradAlign: FedGA to be run with ``local_steps=1`` (Algorithm 1)."""
    return fedga(local, beta, server_optimizer, name="gradalign")


def lbsgd(learning_rate: float, *, weight_decay: float = 0.0, momentum: float = 0.0,
          clip_norm: float | None = None) -> Algorithm:
    """Large-batch SGD on gbar(x): FedSGD whose server step is torch SGD (see the module doc)."""
    server = local_sgd(learning_rate, momentum=momentum, weight_decay=weight_decay,
                       clip_norm=clip_norm).chain(0)
    return fedavg(optax.sgd(1.0), server, name="lbsgd")
