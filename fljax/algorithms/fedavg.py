"""FedAvg, FedAvgM, FedAdam-style server optimizers, and FedSGD.

McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized Data",
AISTATS 2017; Reddi et al., "Adaptive Federated Optimization", ICLR 2021 (server optimizers).

Client i runs K local optimizer steps from y_i,0 = w^t and sends the pseudo-gradient
    Delta_i = w^t - y_i,K.
The server forms Delta = sum_{i in S} p_i Delta_i (p_i proportional to n_i, or 1/|S|) and applies a
server optax transformation to it as a gradient:  w^{t+1} = w^t + ServerOpt(Delta).
With ``optax.sgd(eta_g)`` this is w^{t+1} = w^t - eta_g * Delta (FedAvg is eta_g = 1);
``optax.sgd(eta_g, momentum=beta)`` is FedAvgM, ``optax.adam`` a FedAdam-style server.
"""

from __future__ import annotations

import optax

from fljax.algorithms.base import (Algorithm, ClientContext, ClientOptimizer, LocalSGD,
                                   as_client_optimizer, identity_loss, identity_start,
                                   no_client_state, tree_scale, tree_sub)


def fedavg(client_optimizer: LocalSGD | optax.GradientTransformation | ClientOptimizer,
           server_optimizer: optax.GradientTransformation | None = None,
           *, name: str = "fedavg") -> Algorithm:
    """FedAvg with a local optimizer and a server optimizer on the pseudo-gradient (default sgd(1))."""
    client_tx_of_round = as_client_optimizer(client_optimizer)
    server_tx = server_optimizer if server_optimizer is not None else optax.sgd(1.0)

    def client_tx(ctx: ClientContext) -> optax.GradientTransformation:
        return client_tx_of_round(ctx.round)

    def client_end(ctx: ClientContext, start, end):
        del start
        return ctx.client_state, tree_scale(ctx.weight, tree_sub(ctx.params, end))

    def server_update(params, server_state, delta, round_index):
        del round_index
        updates, server_state = server_tx.update(delta, server_state, params)
        return optax.apply_updates(params, updates), server_state

    return Algorithm(name=name, server_init=server_tx.init, client_init=no_client_state,
                     client_start=identity_start, client_tx=client_tx, client_loss=identity_loss,
                     client_end=client_end, server_update=server_update)


def fedsgd(learning_rate: float) -> Algorithm:
    """FedSGD: each client sends its full-batch gradient g_i(w); w <- w - lr * sum_i p_i g_i.

    Run it with one local step on the full local batch (``batch_size=None, local_steps=1``): one
    local SGD step of lr 1 makes Delta_i = g_i, and the server applies sgd(learning_rate).
    """
    return fedavg(optax.sgd(1.0), optax.sgd(learning_rate), name="fedsgd")
