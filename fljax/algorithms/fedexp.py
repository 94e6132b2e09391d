"""FedExP: FedAvg with an adaptive server step size from the extrapolation of POCS.

Jhunjhunwala, Wang, Joshi, "FedExP: Speeding Up Federated Averaging via Extrapolation", ICLR 2023.

Clients run FedAvg's local steps from x = w^t and send D_i = y_i,K - x together with the scalar
p_i ||D_i||^2 (||.|| over all parameters). With D_bar = sum_{i in S} p_i D_i the server sets

    eta_g   = max(1, sum_{i in S} p_i ||D_i||^2 / (2 (||D_bar||^2 + eps_t)))
    w^{t+1} = w^t + eta_g D_bar

(the paper writes sum_i ||D_i||^2 / (2M(||D_bar||^2 + eps)) for uniform weights p_i = 1/M).
eps_t is the paper's eps (default, ``eps_times_cohort=False, eps_decay=1``) or the official code's
(``Divyansh03/FedExP`` ``main.py``): ``eps_times_cohort=True`` multiplies it by the cohort size |S|,
and ``eps_decay=d`` multiplies it by d**2 before every round, round 0 included:

    eps_t = eps * (|S| if eps_times_cohort else 1) * eps_decay**(2 (t + 1)).

The official code runs decay = 0.998 with eps = 1e-3 (CIFAR, CINIC) or 0.1 (EMNIST), and its local
lr is decayed the same way before every round: ``local_sgd(0.01 * 0.998, round_decay=0.998, ...)``.
It weights by n_i (the engine's aggregation='examples').

Evaluation uses the average of the last two global models:

    eval_models = {"global": (w^{t+1} + w^t) / 2, "last": w^{t+1}};

training continues from w^{t+1}. As in the official code, the model evaluated after the first round
(t = 0) is w^1 itself (``if t > 0 ... else w_vec_avg = w_vec_estimate``), and before any round both
are the initial model. The server state also keeps the last eta_g (``step_size``) for logging.
Not copied: FedBug's fedexp (eps = M and no 1/2) and the official ``fedavgm(exp)`` variant.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from fljax.algorithms.base import (Algorithm, ClientContext, ClientOptimizer, LocalSGD, Params,
                                   tree_scale, tree_sub)
from fljax.algorithms.fedavg import fedavg
from fljax.errors import FljaxError


class FedExPState(NamedTuple):
    previous: Params      # w^t, the global model before the last update (for evaluation)
    step_size: jax.Array  # shape=(), float: the last eta_g (1 before any round)


def squared_norm(tree: Params) -> jax.Array:
    """||tree||^2 over all leaves."""
    return sum(jnp.sum(jnp.square(leaf)) for leaf in jax.tree.leaves(tree))


def fedexp(local: LocalSGD | optax.GradientTransformation | ClientOptimizer, *, eps: float = 1e-3,
           eps_times_cohort: bool = False, eps_decay: float = 1.0,
           name: str = "fedexp") -> Algorithm:
    """FedExP on FedAvg's clients; ``eps`` (paper form by default) as in the module docstring."""
    if not (math.isfinite(eps) and eps > 0):
        raise FljaxError(f"eps must be > 0 and finite, got {eps}")
    if not 0 < eps_decay <= 1:
        raise FljaxError(f"eps_decay must be in (0, 1], got {eps_decay}")
    base = fedavg(local, name=name)

    def server_init(params):
        dtype = jax.tree.leaves(params)[0].dtype
        return FedExPState(previous=params, step_size=jnp.ones((), dtype))

    def client_end(ctx: ClientContext, start, end):
        del start
        delta = tree_sub(ctx.params, end)                           # -D_i
        one = jnp.ones((), ctx.weight.dtype)                        # sums to |S|
        return ctx.client_state, (tree_scale(ctx.weight, delta), ctx.weight * squared_norm(delta),
                                  one)

    def server_update(params, state, message, round_index):
        del state
        delta, mean_sq, cohort_size = message                       # -D_bar, sum p_i ||D_i||^2, |S|
        dtype = mean_sq.dtype
        eps_t = eps * (cohort_size if eps_times_cohort else 1.0)
        eps_t = eps_t * jnp.asarray(eps_decay, dtype) ** (2 * (round_index + 1))
        step = jnp.maximum(1.0, mean_sq / (2.0 * (squared_norm(delta) + eps_t))).astype(dtype)
        new = jax.tree.map(lambda x, d: (x - step * d).astype(x.dtype), params, delta)
        previous = jax.tree.map(lambda n, x: jnp.where(round_index == 0, n, x), new, params)
        return new, FedExPState(previous=previous, step_size=step)

    def eval_models(params, state):
        mean = jax.tree.map(lambda a, b: ((a + b) / 2).astype(a.dtype), params, state.previous)
        return {"global": mean, "last": params}

    return base._replace(server_init=server_init, client_end=client_end,
                         server_update=server_update, eval_models=eval_models)
