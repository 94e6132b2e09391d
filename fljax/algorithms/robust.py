"""Byzantine-robust aggregation over any algorithm whose clients send one model-sized update.

``robust(algorithm, rule, f=...)`` asks the engine for the cohort's messages side by side
(``Algorithm.aggregate``; memory: m model-sized rows, m the cohort's slots) instead of their sum.
Each client sends its update unweighted (its ``client_end`` sees p_i = 1); the server reduces the
m rows u_1..u_m of the clients that joined with the rule, optionally after a pre-aggregator, and
hands the result to the algorithm's own server update in place of sum_i p_i u_i:

    v = RULE(PRE(u_1, ..., u_m))                     server_update(w, s, v, t)

The rules (``fljax.robustness.aggregators``; each function's docstring gives its equation and paper):
``mean`` (sum_i p_i u_i: the plain round's message), ``median`` (coordinate-wise), ``trimmed_mean``
(f cut from each side, per coordinate), ``krum`` and ``multi_krum`` (Blanchard et al. 2017: the
score is the sum of squared distances to the n-f-2 nearest), ``bulyan`` (El Mhamdi et al. 2018),
``geometric_median`` (RFA's smoothed Weiszfeld, Pillutla et al. 2022, weighted by p_i),
``centered_clipping`` (Karimireddy et al. 2021, from the previous round's aggregate, kept in the
server state). Pre-aggregators: ``nnm`` (Allouah et al. 2023), ``bucketing`` (Karimireddy et al.
2022, buckets of ``bucket_size`` drawn from the round's key), ``arc`` (Allouah et al.).

Refused in one line: an algorithm whose clients send more than one model-sized update (SCAFFOLD's
control variates, FedGA's first exchange), and one that aggregates itself already.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from fljax.robustness import aggregators
from fljax.algorithms.base import (Algorithm, ClientContext, CohortMessages, Params,
                                   with_inner_server_state)
from fljax.errors import FljaxError
from fljax.hyperparams import NON_NEGATIVE, POSITIVE, check

RULES = ("mean", "median", "trimmed_mean", "krum", "multi_krum", "bulyan", "geometric_median",
         "centered_clipping")
PRE_AGGREGATORS = ("none", "nnm", "bucketing", "arc")
# Weiszfeld iterations of the geometric median by default: from the weighted mean, 8 can stay far
# from the median when one outlier drags the start (tests/test_aggregators.py); RFA's code uses 3
# with its own stopping rule.
GEOMETRIC_ITERATIONS = 16


class RobustServerState(NamedTuple):
    inner: Any          # the wrapped algorithm's server state
    center: Params      # the last aggregate (centered clipping's start)


def as_matrix(messages: Params) -> tuple[jax.Array, Callable[[jax.Array], Params]]:
    """The stacked messages (leaves [m, ...]) as one matrix [m, d], each row a message raveled
    leaf after leaf, and the function that lays a vector [d] out as one message again."""
    _, unravel = ravel_pytree(jax.tree.map(lambda a: a[0], messages))
    return jax.vmap(lambda row: ravel_pytree(row)[0])(messages), unravel


def model_sized(name: str, what: str, update: Any, params: Params) -> None:
    """Refuse, in one line, an algorithm whose clients send more than one model-sized update."""
    if jax.tree.structure(update) != jax.tree.structure(params) or any(
            jnp.shape(u) != jnp.shape(p) for u, p in zip(jax.tree.leaves(update),
                                                        jax.tree.leaves(params))):
        raise FljaxError(f"{what} needs one model-sized update per client, but {name}'s clients "
                         f"send {jax.tree.structure(update)}")


def unweighted_end(algorithm: Algorithm, what: str):
    """``client_end`` sending the algorithm's update unweighted (p_i = 1), checked model-sized."""
    def client_end(ctx: ClientContext, start, end):
        state, update = algorithm.client_end(ctx._replace(weight=jnp.ones_like(ctx.weight)),
                                             start, end)
        model_sized(algorithm.name, what, update, ctx.params)
        return state, update
    return client_end


def weighted_sum(cohort: CohortMessages) -> Params:
    """sum_i p_i u_i over the stacked rows: what a plain round's summed message is."""
    return jax.tree.map(lambda rows: jnp.tensordot(cohort.weights.astype(rows.dtype), rows,
                                                   axes=1), cohort.messages)


def robust(algorithm: Algorithm, rule: str = "median", *, f: float = 0, pre: str = "none",
           bucket_size: int = 2, q: int | None = None, tau: float = 1.0,
           iterations: int | None = None, nu: float = 1e-6) -> Algorithm:
    """``algorithm`` with its cohort's updates aggregated by ``rule`` (one of RULES) after the
    pre-aggregator ``pre`` (one of PRE_AGGREGATORS).

    ``f``: the Byzantine clients the rule tolerates (trimmed mean, Krum, Multi-Krum, Bulyan, NNM,
    ARC), a whole number that may be traced (the rules compare positions with it: a grid over f
    is one program); ``q``: Multi-Krum's rows averaged (default n - f); ``tau``: centered
    clipping's radius; ``iterations``: centered clipping's L (default 1) or the geometric
    median's Weiszfeld iterations (default GEOMETRIC_ITERATIONS), ``nu`` its smoothing;
    ``bucket_size``: bucketing's s. Memory: the m slots' model-sized updates, side by side."""
    if rule not in RULES:
        raise FljaxError(f"robust: rule must be one of {RULES}, got {rule!r}")
    if pre not in PRE_AGGREGATORS:
        raise FljaxError(f"robust: pre must be one of {PRE_AGGREGATORS}, got {pre!r}")
    check("f", f, lambda v: v >= 0 and float(v).is_integer(), "a whole number >= 0")
    for name, value, least in (("bucket_size", bucket_size, 1),
                               ("iterations", 1 if iterations is None else iterations, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise FljaxError(f"robust: {name} must be a whole number >= {least}, got {value!r}")
    if q is not None and (isinstance(q, bool) or not isinstance(q, int) or q < 1):
        raise FljaxError(f"robust: q must be a whole number >= 1 or unset, got {q!r}")
    check("tau", tau, POSITIVE, "> 0")
    check("nu", nu, NON_NEGATIVE, ">= 0")
    if algorithm.aggregate is not None:
        raise FljaxError(f"robust cannot wrap {algorithm.name}: it aggregates its cohort itself "
                         f"(a byzantine wrapper goes outside robust)")
    if algorithm.cohort_start is not None:
        raise FljaxError(f"robust cannot wrap {algorithm.name}: its clients send a first "
                         f"message (cohort_start) that no rule would see")

    def inner_view(ctx: ClientContext) -> ClientContext:
        return ctx._replace(server_state=ctx.server_state.inner)

    def server_init(params):
        return RobustServerState(algorithm.server_init(params),
                                 jax.tree.map(jnp.zeros_like, params))

    def reduce(cohort: CohortMessages):
        x, _ = as_matrix(cohort.messages)
        mask, weights = cohort.joined, cohort.weights
        if pre == "nnm":
            x, mask = aggregators.nearest_neighbor_mixing(x, mask, f)
        elif pre == "arc":
            x, mask = aggregators.adaptive_robust_clipping(x, mask, f)
        elif pre == "bucketing":
            x, mask = aggregators.bucketing(x, mask, cohort.key, bucket_size)
            weights = mask / jnp.maximum(mask.sum(), 1)
        if rule == "mean":
            return aggregators.weighted_mean(x, mask, weights)
        if rule == "median":
            return aggregators.coordinate_median(x, mask)
        if rule == "trimmed_mean":
            return aggregators.trimmed_mean(x, mask, f)
        if rule == "krum":
            return aggregators.krum(x, mask, f)
        if rule == "multi_krum":
            return aggregators.multi_krum(x, mask, f, mask.sum() - f if q is None else q)
        if rule == "bulyan":
            return aggregators.bulyan(x, mask, f)
        if rule == "geometric_median":
            return aggregators.geometric_median(x, mask, weights, nu=nu,
                                                iterations=iterations or GEOMETRIC_ITERATIONS)
        center = ravel_pytree(cohort.server_state.center)[0]
        return aggregators.centered_clipping(x, mask, center, tau=tau, iterations=iterations or 1)

    def aggregate(cohort: CohortMessages):
        return as_matrix(cohort.messages)[1](reduce(cohort)), {}

    def server_update(params, server_state: RobustServerState, message, round_index):
        params, inner = algorithm.server_update(params, server_state.inner, message, round_index)
        return params, RobustServerState(inner, message)

    shown = rule if pre == "none" else f"{pre}+{rule}"
    return with_inner_server_state(
        algorithm, name=f"{algorithm.name}+{shown}", server_init=server_init,
        client_end=lambda ctx, start, end: unweighted_end(algorithm, "robust")(
            inner_view(ctx), start, end),
        server_update=server_update, aggregate=aggregate, rebase=None)
