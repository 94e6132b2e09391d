"""FedCM: federated learning with client-level momentum.

Xu, Wang, Wang, Wang, Sun, Zhang, "FedCM: Federated Learning with Client-level Momentum",
arXiv:2106.10874, 2021. No official code was found; this follows FL-Simulator
(``woodenchild95/FL-Simulator`` ``server/FedCM.py``, ``client/fedcm.py``).

The server keeps Delta_g, the previous round's average update turned into a gradient (0 at round
0). Every local step of the sampled clients uses the mixed direction

    v = alpha g(y) + (1 - alpha) Delta_g,
    y <- y - eta_l decay^t [ clip(v) + wd * y ]                                 (torch-style)

(FL-Simulator's loss alpha CE + (1 - alpha) <y, Delta_g>: the mixture is clipped, weight decay is
added after clipping and is NOT scaled by alpha). Then, with p_i the engine's aggregation weights
(FL-Simulator's plain mean over the sampled clients is aggregation='uniform'):

    x       <- x + eta_g sum_{i in S} p_i (y_i,K_i - x)                         (eta_g = server_lr)
    Delta_g <- - sum_{i in S} p_i (y_i,K_i - x) / K_i  /  (eta_l decay^t)

K_i is the number of steps client i took this round (``ctx.num_steps``) and eta_l decay^t is the lr
of the round that produced the update (FL-Simulator's lr_prev = lr_current / lr_decay at the next
round). Round 0 trains with Delta_g = 0, i.e. with the loss gradient scaled by alpha, as
FL-Simulator does. Default alpha = 0.1 (FL-Simulator's ``--alpha``); alpha = 1 is FedAvg exactly.
Not copied: FL-Simulator's K = E * n_0 / B computed as a float from client 0's data size for every
client (a pitfall: every client gets client 0's K), and FedBug's fedcm, which is not implemented.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from fljax.registry import declare
from fljax.algorithms.base import (Algorithm, ClientContext, LocalSGD, Params, tree_scale,
                                   tree_sub)
from fljax.algorithms.fedavg import fedavg
from fljax.algorithms.transforms import add_constant
from fljax.errors import FljaxError
from fljax.hyperparams import POSITIVE, check


class FedCMState(NamedTuple):
    momentum: Params   # Delta_g, in gradient units
    server: optax.OptState  # the server sgd(eta_g)'s state


@declare(aggregation="uniform")   # the paper's / official code's unweighted mean
def fedcm(local: LocalSGD, *, alpha: float = 0.1, server_lr: float = 1.0,
          name: str = "fedcm") -> Algorithm:
    """FedCM with mixing weight ``alpha`` on the loss gradient, on the local optimizer ``local``."""
    if not isinstance(local, LocalSGD):
        raise FljaxError(f"fedcm needs a LocalSGD local optimizer (Delta_g is normalized by its "
                         f"lr), got {type(local).__name__}")
    check("alpha", alpha, lambda v: 0 < v <= 1, "in (0, 1]")
    check("server_lr", server_lr, POSITIVE, "> 0 and finite")
    base = fedavg(local, optax.sgd(server_lr), name=name)

    def server_init(params):
        return FedCMState(momentum=jax.tree.map(jnp.zeros_like, params),
                          server=base.server_init(params))

    def client_tx(ctx: ClientContext) -> optax.GradientTransformation:
        mixed = [optax.scale(alpha),
                 add_constant(tree_scale(1.0 - alpha, ctx.server_state.momentum))]
        return local.chain(ctx.round, loss_terms=mixed)

    def client_end(ctx: ClientContext, start, end):
        del start
        delta = tree_sub(ctx.params, end)                           # x - y_i,K
        steps = ctx.num_steps.astype(ctx.weight.dtype)
        return ctx.client_state, (tree_scale(ctx.weight, delta),
                                  tree_scale(ctx.weight / steps, delta))

    def server_update(params, state, message, round_index):
        delta, per_step = message
        lr = local.lr(round_index)
        momentum = jax.tree.map(lambda d: (d / lr).astype(d.dtype), per_step)
        params, server = base.server_update(params, state.server, delta, round_index)
        return params, FedCMState(momentum=momentum, server=server)

    return base._replace(server_init=server_init, client_tx=client_tx, client_end=client_end,
                         payload=lambda round_index: (2, 1),      # x and Delta_g down, y up
                         server_update=server_update)
