"""The switching criterion of FedDyn as initialization (Anonymous, 2024; Proposition 1, Eq. (3)-(5),
A.4): when FedDyn stops paying for itself and FedAvg should take over.

With grad L_k(theta_k^t) the local drift FedDyn keeps for client k after round t (``-alpha_k h_k``,
FedDyn's ``client_vectors()['local_drift']``; 0 before any round) and theta* the optimum:

    C_t = 1/m sum_{k in [m]} ||grad L_k(theta_k^t) - grad L_k(theta*)||^2                   (3)
    D_T = (1/T) (zeta + eta sum_{t=1}^T C_{t-1}),   eta = 1/(2 alpha) + L/(2 alpha^2)         (4)
    D_T <= D_{T+1}  <=>  T eta (C_T - (1/T) sum_{t=1}^T C_{t-1}) >= zeta                      (5)

After round T (T = 1, 2, ...: fljax's round index t = T - 1) the probe computes C_T over ALL m = N
clients (the expectation of (3) over the clients' latest drifts, exact), C_0 from the zero initial
drift, and the condition (5). ``zeta = (1 + L/alpha) Phi_0 / kappa_0`` holds constants of Acar et
al.'s Lemma 1 that no run reveals: it is a parameter here, as is the smoothness L (estimate it
with ``smoothness``; ``centralized_optimum`` gives theta* for a convex model). alpha is FedDyn's
base coefficient (the adaptive alpha_k differ per client; the bound uses one alpha).

Exact when ``optimum`` (theta*) is given. Without it the probe ESTIMATES theta* by the current
global model w^{t+1}, i.e. C_t ~ 1/N sum_k ||grad L_k(theta_k^t) - g_k(w^{t+1})||^2: how far each
client's drift is from its gradient at the consensus point (0 at a stationary point of FedDyn
where every local model equals the global one).

Metrics: ``switch_C`` (C_T), ``switch_D`` (D_T), ``switch_margin`` (the left side of (5) minus
zeta: >= 0 means switch), ``switch_condition`` (1.0 when (5) holds). Cost: one full-batch gradient
pass over every client's data per round. ``fljax.switch(feddyn, fedavg, when=criterion)`` switches
the round after (5) first holds, inside the compiled round.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fljax.algorithms.base import Params
from fljax.data.federated import FederatedData, take
from fljax.errors import FljaxError
from fljax.models.model import Model, cross_entropy
from fljax.probes.base import Probe, RoundView, squared_norm


class CriterionState(NamedTuple):
    optimum: Any          # theta* (() when it is estimated by the global model)
    past: jax.Array       # shape=(): sum_{t=0}^{T-1} C_t
    rounds: jax.Array     # shape=(), int32: T - 1, the rounds measured so far


def switching_criterion(*, alpha: float, smoothness: float, zeta: float,
                        optimum: Params | None = None, vector: str = "local_drift") -> Probe:
    """Proposition 1's C_T, D_T and condition (5) after every round (see the module doc)."""
    for name, value in (("alpha", alpha), ("smoothness", smoothness), ("zeta", zeta)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                not math.isfinite(value) or value <= 0:
            raise FljaxError(f"switching_criterion: {name} must be a finite number > 0, got "
                             f"{value!r}")
    eta = 1.0 / (2 * alpha) + smoothness / (2 * alpha ** 2)

    def init(params, num_clients):
        dtype = jax.tree.leaves(params)[0].dtype
        kept = () if optimum is None else jax.tree.map(lambda o, p: jnp.array(o, p.dtype),
                                                       optimum, params)
        return CriterionState(kept, jnp.zeros((), dtype), jnp.zeros((), jnp.int32)), ()

    def server(view: RoundView):
        state = view.state
        theta_star = view.new_params if optimum is None else state.optimum
        population = view.population

        def add(sums, client):
            drift = view.client_vectors(client)
            if vector not in drift:
                raise FljaxError(f"switching_criterion needs the algorithm's {vector!r} vector "
                                 f"(FedDyn's local drift); {view.algorithm.name!r} exposes "
                                 f"{sorted(drift)}")
            g = population.gradient(client, theta_star)
            gap = jax.tree.map(lambda v, gk: v - gk.astype(v.dtype), drift[vector], g)
            return (sums[0] + squared_norm(gap), sums[1] + squared_norm(g)), None

        zero = state.past * 0
        (gaps, initial), _ = jax.lax.scan(add, (zero, zero),
                                          jnp.arange(population.num_clients))
        c_now, c_zero = gaps / population.num_clients, initial / population.num_clients
        past = jnp.where(state.rounds == 0, c_zero, state.past)     # sum_{t=0}^{T-1} C_t
        rounds = (state.rounds + 1).astype(past.dtype)              # T
        margin = rounds * eta * (c_now - past / rounds) - zeta
        metrics = {"switch_C": c_now, "switch_D": (zeta + eta * past) / rounds,
                   "switch_margin": margin, "switch_condition": (margin >= 0).astype(past.dtype)}
        return CriterionState(state.optimum, past + c_now, state.rounds + 1), metrics

    return Probe(name="switching_criterion", init=init, server=server)


def pooled_loss(model: Model, data: FederatedData):
    """f(w) = sum_k (n_k / n) f_k(w): the mean loss over every example the clients hold."""
    x, y = take(data.x, data.index), data.y[data.index]

    def loss(params):
        return cross_entropy(model.apply(params, x), y)

    return loss


def centralized_optimum(model: Model, data: FederatedData, params: Params, *,
                        steps: int = 500, tolerance: float = 1e-7) -> Params:
    """theta* = argmin of the pooled loss, by full-batch L-BFGS from ``params`` (at most ``steps``
    iterations, stopping when ||grad f|| < tolerance): the optimum of a convex model (e.g.
    ``make_model('linear', ...)``, softmax regression), a stationary point otherwise."""
    loss = pooled_loss(model, data)
    solver = optax.lbfgs()
    value_and_grad = optax.value_and_grad_from_state(loss)

    def step(carry):
        params, state, _ = carry
        value, grad = value_and_grad(params, state=state)
        updates, state = solver.update(grad, state, params, value=value, grad=grad,
                                       value_fn=loss)
        return optax.apply_updates(params, updates), state, optax.tree.norm(grad)

    def running(carry):
        return (optax.tree.get(carry[1], "count") < steps) & (carry[2] >= tolerance)

    params = jax.tree.map(jnp.asarray, params)
    start = (params, solver.init(params), jnp.asarray(jnp.inf, jax.tree.leaves(params)[0].dtype))
    final, _, _ = jax.jit(lambda c: jax.lax.while_loop(running, step, c))(start)
    return final


def smoothness(model: Model, data: FederatedData, params: Params, *, iterations: int = 50,
               seed: int = 0) -> float:
    """An estimate of L: the largest Hessian eigenvalue of the pooled loss at ``params``, by
    power iteration on Hessian-vector products (exact for a quadratic; for softmax regression the
    curvature is largest where the predictions are least certain, so take it near the start)."""
    grad = jax.grad(pooled_loss(model, data))
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
    v = tree.unflatten([jax.random.normal(k, leaf.shape, leaf.dtype)
                        for k, leaf in zip(keys, leaves)])

    @jax.jit
    def power(v):
        def body(_, v):
            hv = jax.jvp(grad, (params,), (v,))[1]
            return jax.tree.map(lambda a: a / jnp.sqrt(squared_norm(hv)), hv)

        v = jax.lax.fori_loop(0, iterations, body, v)
        hv = jax.jvp(grad, (params,), (v,))[1]
        return jnp.sqrt(squared_norm(hv) / squared_norm(v))

    return float(power(v))
