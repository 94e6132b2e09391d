"""FedExP: FedAvg with an adaptive server step size from the extrapolation of POCS.

Jhunjhunwala, Wang, Joshi, "FedExP: Speeding Up Federated Averaging via Extrapolation", ICLR 2023.

Clients run FedAvg's local steps from x = w^t and send D_i = y_i,K - x together with the scalar
p_i ||D_i||^2 (||.|| over all parameters). With D_bar = sum_{i in S} p_i D_i the server sets

    eta_g   = max(1, c sum_{i in S} p_i ||D_i||^2 / (||D_bar||^2 + eps_t))
    w^{t+1} = w^t + eta_g D_bar

with c = 1/2 (the paper's and the official code's factor; ``half=True``, default)

(the paper writes sum_i ||D_i||^2 / (2M(||D_bar||^2 + eps)) for uniform weights p_i = 1/M), or
c = 1 (``half=False``, FedBug's copy, below).
eps_t is the paper's eps (default, ``eps_times_cohort=False, eps_decay=1``) or the official code's
(``Divyansh03/FedExP`` ``main.py``): ``eps_times_cohort=True`` multiplies it by the cohort size |S|,
and ``eps_decay=d`` multiplies it by d**2 before every round, round 0 included:

    eps_t = eps * (|S| if eps_times_cohort else 1) * eps_decay**(2 (t + 1)).

The official code runs decay = 0.998 with eps = 1e-3 (CIFAR, CINIC) or 0.1 (EMNIST), and its local
lr is decayed the same way before every round: ``local_sgd(0.01 * 0.998, round_decay=0.998, ...)``.
It weights by n_i (the engine's aggregation='examples').

Evaluation (``evaluate="average"``, default, the paper and official code) uses the average of the
last two global models:

    eval_models = {"global": (w^{t+1} + w^t) / 2, "last": w^{t+1}};

training continues from w^{t+1}. As in the official code, the model evaluated after the first round
(t = 0) is w^1 itself (``if t > 0 ... else w_vec_avg = w_vec_estimate``), and before any round both
are the initial model. ``evaluate="last"`` reports the last iterate instead,
{"global": w^{t+1}, "average": (w^{t+1} + w^t) / 2}. The server state also keeps the last eta_g
(``step_size``) for logging.

FedBug's copy (``IandRover/FedBug`` ``utils_methods.py``, mode "fedexp"; the FedExP column of
FedBug (Kao and Wang, 2023) Tables 1-2) computes ``max(1, mean_S ||D_i||^2 / (||mean_S D_i||^2 +
len(selected_clnts*0.001)))``, where ``len(array * 0.001)`` is the number M = |S| of sampled
clients: eps_t = M, no 1/2, unweighted means, and it reports the last iterate w^{t+1} (its
``avg_model``) and the mean of all clients' latest models (``all_model``), never the two-iterate
average. That is ``fedexp(local, eps=1.0, eps_times_cohort=True, half=False, evaluate="last")``
with aggregation='uniform' (likely a bug in FedBug's copy; fljax reproduces it as an option
because FedBug's table was produced with it). Not copied: the official ``fedavgm(exp)`` variant.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from fljax.registry import declare
from fljax.algorithms.base import (Algorithm, ClientContext, ClientOptimizer, LocalSGD, Params,
                                   tree_scale, tree_sub)
from fljax.algorithms.fedavg import fedavg
from fljax.errors import FljaxError
from fljax.hyperparams import POSITIVE, check


class FedExPState(NamedTuple):
    previous: Params      # w^t, the global model before the last update (for evaluation)
    step_size: jax.Array  # shape=(), float: the last eta_g (1 before any round)


def squared_norm(tree: Params) -> jax.Array:
    """||tree||^2 over all leaves."""
    return sum(jnp.sum(jnp.square(leaf)) for leaf in jax.tree.leaves(tree))


EVALUATES = ("average", "last")


@declare(aggregation="uniform")   # the paper's / official code's unweighted mean
def fedexp(local: LocalSGD | optax.GradientTransformation | ClientOptimizer, *, eps: float = 1e-3,
           eps_times_cohort: bool = False, eps_decay: float = 1.0, half: bool = True,
           evaluate: str = "average", name: str = "fedexp") -> Algorithm:
    """FedExP on FedAvg's clients; ``eps`` (paper form by default), the factor 1/2 (``half``) and
    the evaluated model (``evaluate``) as in the module docstring."""
    check("eps", eps, POSITIVE, "> 0 and finite")
    check("eps_decay", eps_decay, lambda v: 0 < v <= 1, "in (0, 1]")
    if evaluate not in EVALUATES:
        raise FljaxError(f"evaluate must be one of {EVALUATES}, got {evaluate!r}")
    factor = 0.5 if half else 1.0
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
        step = jnp.maximum(1.0, factor * mean_sq / (squared_norm(delta) + eps_t)).astype(dtype)
        new = jax.tree.map(lambda x, d: (x - step * d).astype(x.dtype), params, delta)
        previous = jax.tree.map(lambda n, x: jnp.where(round_index == 0, n, x), new, params)
        return new, FedExPState(previous=previous, step_size=step)

    def eval_models(params, state):
        mean = jax.tree.map(lambda a, b: ((a + b) / 2).astype(a.dtype), params, state.previous)
        if evaluate == "last":
            return {"global": params, "average": mean}
        return {"global": mean, "last": params}

    return base._replace(server_init=server_init, client_end=client_end,
                         server_update=server_update, eval_models=eval_models)
