"""Buffered asynchronous FL (FedBuff) and FedAsync: one server step is one compiled pure function.

FedBuff: Nguyen et al., "Federated Learning with Buffered Asynchronous Aggregation", AISTATS 2022
(Algorithm 1). FedAsync: Xie, Koyejo, Gupta, "Asynchronous Federated Optimization", 2019
(Algorithm 1, section 5.2's staleness functions).

M clients are in flight (``in_flight``); client j started from the server model of version
tau_j (a copy it holds) at simulated time b_j, and finishes at b_j + d_j, its duration under the
clock (``fljax.population.clock``: drawn from the run's key, its id, tau_j and its number of local steps).
Server step t (the model's version t):

1. the K = ``buffer`` earliest finishers are taken (ties: the lower slot); the clock moves to the
   K-th finish time; each trains from its own start model w^{tau_j} exactly as a client of round
   tau_j would (the same batch keys), and its staleness is t - tau_j;
2. FedBuff: the wrapped algorithm's messages m_j (each scaled by p_j, the aggregation weights
   over the K: n_j / sum n or 1/K) are weighted by s(t - tau_j) and summed, and the algorithm's
   server update applies the sum (FedAvg: w^{t+1} = w^t - eta_g sum_j p_j s_j Delta_j);
   FedAsync (K = 1): w^{t+1} = (1 - alpha_t) w^t + alpha_t x_j, alpha_t = alpha s(t - tau_j),
   x_j = w^{tau_j} - Delta_j the client's local model (the message must be one model-sized
   Delta_j);
3. K new clients start from w^{t+1} at the clock's time, drawn uniformly without replacement
   from the N - (M - K) clients not in flight with round t+1's cohort key.

Staleness functions s (FedAsync section 5.2): 'constant' 1; 'polynomial' (1 + tau)^-a (FedBuff's
1/sqrt(1 + tau) is a = 0.5); 'hinge' 1 for tau <= b, else 1 / (a (tau - b) + 1).

With M = K every client starts and ends in the same step with staleness 0: a step is exactly
synchronous FedAvg's round t (the same cohort, batches and sum order). Algorithms with per-client
state (SCAFFOLD, FedDyn, Ditto, ...) are refused: their clients' state would change while other
copies of the model are in flight, and none of their papers says how stale corrections combine.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from fljax.algorithms.base import Algorithm, Params
from fljax.population.clock import Clock
from fljax.population.cohort import cohort_weights, round_key, sample_cohort
from fljax.errors import FljaxError
from fljax.hyperparams import check

RULES = ("fedbuff", "fedasync")
STALENESS = ("constant", "polynomial", "hinge")


class Asynchrony(NamedTuple):
    """FedBuff or FedAsync (module docstring): ``in_flight`` M clients, a server step per
    ``buffer`` K finishers, staleness function ``staleness`` with ``a`` (and ``b`` for hinge),
    FedAsync's mixing weight ``alpha``."""

    in_flight: int
    buffer: int
    rule: str = "fedbuff"
    staleness: str = "polynomial"
    a: float = 0.5
    b: float = 4.0
    alpha: float = 0.6


class Flight(NamedTuple):
    """The clients in flight and the simulated clock (part of the round's state)."""

    now: jax.Array           # shape=(), float: simulated time of the last server step
    ids: jax.Array           # [M] int32: the client in each slot
    started: jax.Array       # [M] int32: the model version each started from
    began: jax.Array         # [M] float: the simulated time each started
    start_params: Params     # [M, ...]: the model each started from


def check_asynchrony(asynchrony: Asynchrony, num_clients: int) -> Asynchrony:
    """Raise FljaxError naming a bad value; return ``asynchrony``."""
    m, k = asynchrony.in_flight, asynchrony.buffer
    for name, value in (("in_flight", m), ("buffer", k)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise FljaxError(f"{name} must be a whole number >= 1, got {value!r}")
    if k > m:
        raise FljaxError(f"buffer ({k}) must be at most in_flight ({m}): a server step takes "
                         f"the first buffer finishers of the clients in flight")
    if m > num_clients:
        raise FljaxError(f"in_flight ({m}) must be at most the number of clients "
                         f"({num_clients})")
    if asynchrony.rule not in RULES:
        raise FljaxError(f"rule must be one of {RULES}, got {asynchrony.rule!r}")
    if asynchrony.rule == "fedasync" and k != 1:
        raise FljaxError(f"fedasync updates the model with each finisher: buffer must be 1, "
                         f"got {k}")
    if asynchrony.staleness not in STALENESS:
        raise FljaxError(f"staleness must be one of {STALENESS}, got "
                         f"{asynchrony.staleness!r}")
    check("a", asynchrony.a, lambda v: v >= 0, ">= 0 and finite")
    check("b", asynchrony.b, lambda v: v >= 0, ">= 0 and finite")
    check("alpha", asynchrony.alpha, lambda v: 0 < v <= 1, "in (0, 1]")
    return asynchrony


def check_algorithm(algorithm: Algorithm, params: Params) -> None:
    """Refuse, in one line, an algorithm that cannot run asynchronously."""
    if jax.tree.leaves(jax.eval_shape(algorithm.client_init, params)):
        raise FljaxError(f"{algorithm.name} keeps per-client state, which cannot run "
                         f"asynchronously: a client's state would change while other copies of "
                         f"the model are in flight (use a stateless algorithm: FedAvg, FedProx, "
                         f"FedAdam, FedBug, FedDecay, ...)")
    if algorithm.cohort_start is not None:
        raise FljaxError(f"{algorithm.name} needs a first exchange with the whole cohort "
                         f"(cohort_start), which has no asynchronous form")
    if algorithm.perturb is not None:
        raise FljaxError(f"{algorithm.name} adds server noise calibrated to a cohort; it has no "
                         f"asynchronous form here")
    if algorithm.aggregate is not None:
        raise FljaxError(f"{algorithm.name} aggregates the cohort's messages side by side (a "
                         f"robust rule or simulated attack); asynchronous rounds have no cohort "
                         f"to stack")


def staleness_weight(asynchrony: Asynchrony, tau: jax.Array) -> jax.Array:
    """s(tau) (module docstring)."""
    tau = tau.astype(jnp.result_type(float))
    if asynchrony.staleness == "constant":
        return jnp.ones_like(tau)
    if asynchrony.staleness == "polynomial":
        return (1 + tau) ** -asynchrony.a
    return jnp.where(tau <= asynchrony.b, 1.0,
                     1 / (asynchrony.a * (tau - asynchrony.b) + 1))


def initial_flight(asynchrony: Asynchrony, key: jax.Array, params: Params,
                   num_clients: int) -> Flight:
    """Version 0: M clients drawn with round 0's cohort key start from ``params`` at time 0."""
    m = asynchrony.in_flight
    dtype = jax.tree.leaves(params)[0].dtype
    ids = sample_cohort(round_key(key, 0)[0], num_clients, m)
    return Flight(now=jnp.zeros((), dtype), ids=ids, started=jnp.zeros(m, jnp.int32),
                  began=jnp.zeros(m, dtype),
                  start_params=jax.tree.map(lambda a: jnp.broadcast_to(a, (m, *a.shape)).copy(),
                                            params))


def replacements(key: jax.Array, num_clients: int, busy: jax.Array, count: int) -> jax.Array:
    """``count`` distinct clients drawn uniformly from those not ``busy`` (ids ascending), with
    Floyd's draw of ``sample_cohort`` over the free ones: with none busy, sample_cohort's."""
    in_use = jnp.zeros(num_clients, bool).at[busy].set(True)
    free = jnp.argsort(in_use, stable=True).astype(jnp.int32)     # free ids first, ascending
    return free[sample_cohort(key, num_clients - busy.shape[0], count)]


def async_round(asynchrony: Asynchrony, clock: Clock, algorithm: Algorithm,
                train_one: Callable, steps_of: Callable, counts: jax.Array, aggregation: str,
                state, data) -> tuple[Any, dict]:
    """One server step (module docstring) of ``state`` (a RoundState whose ``clock`` is a
    Flight). ``train_one(slot inputs) -> (message, metrics)`` trains one client from its start
    model; ``steps_of(ids) -> local steps`` of clients."""
    flight: Flight = state.clock
    if not isinstance(flight, Flight):
        raise FljaxError("the round is asynchronous but the state holds no clients in flight; "
                         "build the state with round_fn.init_state(...)")
    t, k = state.round, asynchrony.buffer
    dtype = flight.now.dtype
    finish = flight.began + clock.durations(state.key, flight.started, flight.ids,
                                            steps_of(flight.ids), dtype)
    order = jnp.argsort(finish, stable=True)
    taken = jnp.sort(order[:k])                       # in slot order, as a round sums
    now = jnp.max(finish[taken])
    ids, started = flight.ids[taken], flight.started[taken]
    weights = cohort_weights(counts[ids], aggregation, dtype)
    scale = staleness_weight(asynchrony, t - started).astype(dtype)
    starts = jax.tree.map(lambda a: a[taken], flight.start_params)
    messages, metrics = jax.lax.map(lambda xs: train_one(*xs),
                                    (ids, weights, started, starts))
    if asynchrony.rule == "fedbuff":
        summed = jax.tree.map(lambda m: jnp.tensordot(scale.astype(m.dtype), m, axes=1),
                              messages)
        params, server_state = algorithm.server_update(state.params, state.server_state,
                                                       summed, t)
    else:
        if jax.tree.structure(jax.tree.map(lambda m: m[0], messages)) != jax.tree.structure(
                state.params):
            raise FljaxError(f"fedasync mixes the client's local model into the server's: "
                             f"{algorithm.name}'s message is not one model-sized update")
        rate = asynchrony.alpha * scale[0]
        params = jax.tree.map(lambda w, w0, d: ((1 - rate) * w + rate * (w0[0] - d[0])
                                                ).astype(w.dtype),
                              state.params, starts, messages)
        server_state = state.server_state
    staying = jnp.ones(flight.ids.shape[0], bool).at[taken].set(False)
    busy = flight.ids[jnp.argsort(~staying, stable=True)[:flight.ids.shape[0] - k]]
    fresh = replacements(round_key(state.key, t + 1)[0], counts.shape[0], busy, k)
    new_flight = Flight(
        now=now, ids=flight.ids.at[taken].set(fresh),
        started=flight.started.at[taken].set(t + 1),
        began=flight.began.at[taken].set(now),
        start_params=jax.tree.map(lambda s, w: s.at[taken].set(
            jnp.broadcast_to(w, (k, *w.shape))), flight.start_params, params))
    new_state = state._replace(round=t + 1, params=params, server_state=server_state,
                               clock=new_flight)
    finite = jnp.all(jnp.array([jnp.all(jnp.isfinite(p)) for p in jax.tree.leaves(params)]))
    step_metrics = {"train_loss": jnp.sum(weights * metrics.pop("loss")),
                    "clients": ids, "params_finite": finite, "client_steps": metrics.pop("steps"),
                    "staleness": jnp.mean((t - started).astype(dtype)),
                    "max_staleness": jnp.max(t - started),
                    "sim_time": now,
                    **{name: jnp.mean(values) for name, values in metrics.items()}}
    return new_state, step_metrics
