"""FedDyn: federated learning with dynamic regularization, as the official code runs it.

Acar, Zhao, Matas, Mattina, Whatmough, Saligrama, "Federated Learning Based on Dynamic
Regularization", ICLR 2021; official code ``alpemreacar/FedDyn`` (``train_FedDyn``,
``train_feddyn_mdl``). Ablations from "FedDyn as initialization" (Anonymous, 2024,
appendix A.8).

Paper. Client k in P_t solves
    theta_k^t = argmin_theta L_k(theta) - <grad L_k(theta_k^{t-1}), theta>
                                        + alpha/2 ||theta - theta^{t-1}||^2,
    grad L_k(theta_k^t) = grad L_k(theta_k^{t-1}) - alpha (theta_k^t - theta^{t-1}),
and the server sets
    h^t = h^{t-1} - alpha/m sum_{k in P_t} (theta_k^t - theta^{t-1}),
    gamma^t = 1/|P_t| sum_{k in P_t} theta_k^t,      theta^t = gamma^t - h^t / alpha.

Official code (implemented here). Client k keeps h_k = -grad L_k(theta_k)/alpha_k, initialized to 0.
With theta_s = w^t the broadcast model and alpha_k = alpha / (n_k / mean_j n_j) ("adaptive alpha",
mean over ALL N clients; ``adaptive_alpha=False`` gives alpha_k = alpha, as FL-Simulator does), each
local step on the loss CE(y) + alpha_k <y, h_k - theta_s> with SGD weight decay wd + alpha_k is

    y <- y - eta_l decay^t [ clip( g_k(y) + alpha_k (h_k - theta_s) ) + (wd + alpha_k) y ]

(the linear term is in the loss, so it is clipped; alpha_k's quadratic part sits in torch's
weight_decay, so it is not). After the local steps: h_k <- h_k + (y_k,K - theta_s). The server sets

    gamma^t = sum_{k in S} p_k y_k,K                 theta^{t+1} = gamma^t + mean_{all N} h_k

where the official code's mean over S is UNWEIGHTED (p_k = 1/|S|: the engine's
aggregation='uniform'); the weights are the engine's ctx.weight, so aggregation='examples' gives
the n_k-weighted variant. Clients never sampled contribute h_k = 0 to mean_all.

The server cannot read the unsampled clients' states, so it keeps H^t = mean_all h_k itself,
updated by the clients' summed message:
    H^{t+1} = H^t + (1/N) sum_{k in S} (y_k,K - theta_s).
Proof that H^t = (1/N) sum_{all k} h_k^t: at t = 0 both are 0. If it holds at t, then after round t
the sampled clients' h_k grew by y_k,K - theta_s and the others' did not change, so
(1/N) sum_all h_k^{t+1} = (1/N) sum_all h_k^t + (1/N) sum_S (y_k,K - theta_s) = H^{t+1}.

The server state also keeps gamma^t, and ``eval_models`` reports {'global': theta, 'gamma': gamma}
(FedDyn as initialization (Anonymous, 2024), Figure 8, compares the two). Ablations (appendix A.8):
``client_regularization=False`` is "FedDyn w/o Reg" (plain local SGD; h_k and the server correction
as in FedDyn; equal to alpha -> 0), ``server_correction=False`` is "FedDyn w/o h" (regularized
clients; theta = gamma). Both off is FedAvg. Every variant keeps h_k (the local drift the
paper measures, and the same state whatever the variant, so a run can switch between them and keep
it: ``switch(feddyn(...), feddyn(..., server_correction=False), T, carry_state=True)`` is Figure
12's FedDyn -> FedDyn w/o h, continuing from FedDyn's h_k and H).

Defaults are the official code's: alpha = 1e-2, adaptive alpha. The engine gives every client its
n_k and the mean of n_j over all N clients (``ctx.num_examples``, ``ctx.mean_examples``), so
adaptive alpha needs nothing more from the caller.

``client_vectors`` exposes each client's local drift grad L_k(theta_k) = -alpha_k h_k (the
official code's sign convention, FedDyn as initialization (Anonymous, 2024) Figures 10b, 11, 13b),
for probes such as ``fljax.probes.state_diversity``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fljax.registry import declare
from fljax.algorithms.base import (Algorithm, ClientContext, LocalSGD, identity_loss,
                                   identity_start, tree_scale, tree_sub)
from fljax.algorithms.transforms import add_constant
from fljax.errors import FljaxError
from fljax.hyperparams import POSITIVE, check


class FedDynServerState(NamedTuple):
    h_mean: Any   # H^t = mean over all N clients of h_k
    gamma: Any    # gamma^t = sum_S p_k y_k,K, the aggregate before the h correction


@declare(aggregation="uniform")   # the paper's / official code's unweighted mean
def feddyn(local: LocalSGD, *, alpha: float = 1e-2, adaptive_alpha: bool = True,
           client_regularization: bool = True, server_correction: bool = True,
           name: str = "feddyn") -> Algorithm:
    """FedDyn (official code) with coefficient ``alpha`` on the local optimizer ``local``."""
    if not isinstance(local, LocalSGD):
        raise FljaxError(f"feddyn needs a LocalSGD local optimizer (its linear term is clipped "
                         f"with the loss gradient), got {type(local).__name__}")
    check("alpha", alpha, POSITIVE, "> 0 and finite")

    def alpha_of(ctx: ClientContext):
        """alpha_k = alpha / (n_k / mean_j n_j) (adaptive), else alpha."""
        if not adaptive_alpha:
            return alpha
        return alpha * ctx.mean_examples / ctx.num_examples.astype(ctx.mean_examples.dtype)

    def client_init(params):
        return jax.tree.map(jnp.zeros_like, params)                           # h_k = 0

    def server_init(params):
        # gamma is a copy: the engine donates its state, and one buffer must not appear twice.
        return FedDynServerState(h_mean=jax.tree.map(jnp.zeros_like, params),
                                 gamma=jax.tree.map(lambda w: jnp.array(w, copy=True), params))

    def client_tx(ctx: ClientContext) -> optax.GradientTransformation:
        if not client_regularization:
            return local.chain(ctx.round)
        a = alpha_of(ctx)
        linear = jax.tree.map(lambda h, w: a * (h - w), ctx.client_state, ctx.params)
        return local.chain(ctx.round, loss_terms=[add_constant(linear)], extra_weight_decay=a)

    def client_end(ctx: ClientContext, start, end):
        del start
        drift = tree_sub(end, ctx.params)                                     # y_k,K - theta_s
        h_new = jax.tree.map(jnp.add, ctx.client_state, drift)
        message = (tree_scale(ctx.weight, drift), tree_scale(1.0 / ctx.num_clients, drift))
        return h_new, message

    def server_update(params, server_state, message, round_index):
        del round_index
        delta, h_step = message
        gamma = jax.tree.map(jnp.add, params, delta)
        h_mean = jax.tree.map(jnp.add, server_state.h_mean, h_step)
        new_params = jax.tree.map(jnp.add, gamma, h_mean) if server_correction else gamma
        return new_params, FedDynServerState(h_mean=h_mean, gamma=gamma)

    def eval_models(params, server_state):
        return {"global": params, "gamma": server_state.gamma}

    def rebase(ctx: ClientContext, message, shift):
        """The model part measured from theta_s + shift: p_k (y - theta_s - shift); H's step
        (y - theta_s) / N, like h_k, keeps theta_s."""
        delta, h_step = message
        return tree_sub(delta, tree_scale(ctx.weight, shift)), h_step

    def client_vectors(ctx: ClientContext):
        """{'local_drift': grad L_k(theta_k) = -alpha_k h_k}."""
        a = alpha_of(ctx)
        return {"local_drift": jax.tree.map(lambda h: (-a * h).astype(h.dtype), ctx.client_state)}

    return Algorithm(name=name, server_init=server_init, client_init=client_init,
                     client_start=identity_start, client_tx=client_tx, client_loss=identity_loss,
                     client_end=client_end, server_update=server_update, eval_models=eval_models,
                     client_vectors=client_vectors, rebase=rebase)
