"""Byzantine clients: a seeded set of clients sends an attack instead of its update.

``byzantine(algorithm, attack, count=... | fraction=... | ids=[...], seed=0)`` marks Byzantine
clients of the population: ``ids``, or the first ``count`` (``round(fraction * N)``) of a random
permutation of the N clients drawn from ``seed`` (``fljax.robustness.attacks.byzantine_ids``). In each round
the cohort's updates are stacked (``Algorithm.aggregate``), unweighted; the rows of the sampled
Byzantine clients are replaced by the attack, computed from the round's honest rows where it is
omniscient (``fljax.robustness.attacks``: each function's docstring gives its equation and paper), and the
stack goes on to the algorithm's own aggregation (a ``robust`` rule) or, without one, to the
weighted sum sum_i p_i u_i. ``label_flip`` poisons data instead: a Byzantine client trains on
labels y -> C - 1 - y and sends its honest-looking update. Each round logs
``byzantine_sampled``, the Byzantine clients in its cohort.

Attacks: ``sign_flip`` (the negated honest mean), ``gaussian`` (N(0, sigma^2 I) rows), ``alie``
(Baruch et al. 2019: mu - z sigma, z from n and f as the paper sets it, or given), ``ipm`` (Xie et
al. 2020: -epsilon times the honest mean), ``mimic`` (Karimireddy et al. 2022: a copy of one honest
client's update; by default the round's honest client of lowest id, so one fixed client under
full participation; with ``mimic_warmup`` T >= 1 the paper's code's choice: over the first T
rounds the honest client with the largest projection on a running estimate of the direction of
largest variance, ``fljax.robustness.attacks.mimic_warmup``, then that client for the rest of
training; their code's default is T = 1), ``label_flip``.

With ``mimic_warmup`` the wrapper keeps the warm-up's state in the server state
(``MimicState``: the running mean mu, the direction z, the rounds seen, the target's id) and logs
``mimic_target``; its aggregate hands ``server_update`` the pair (message, new warm-up state).
Without it the wrapper has no state of its own.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from fljax.robustness import attacks
from fljax.algorithms.base import (Algorithm, ClientContext, CohortMessages,
                                   with_inner_server_state)
from fljax.algorithms.compress import StaticFloat
from fljax.algorithms.robust import as_matrix, unweighted_end, weighted_sum
from fljax.errors import FljaxError
from fljax.hyperparams import NON_NEGATIVE, check

ATTACKS = ("sign_flip", "gaussian", "alie", "ipm", "mimic", "label_flip")
# Folded into the wrapper's seed for the warm-up's random start z (the clients' draw uses the seed).
MIMIC_START_STREAM = 1


class MimicState(NamedTuple):
    """The mimic warm-up's state, beside the wrapped algorithm's server state (``inner``)."""
    inner: Any          # the wrapped algorithm's server state
    mu: jax.Array       # [d] running mean of the honest updates
    z: jax.Array        # [d] unit direction of largest variance (the random start before round 0)
    seen: jax.Array     # int32: warm-up rounds so far
    target: jax.Array   # int32: the client id to copy (-1: none chosen yet)


def byzantine(algorithm: Algorithm, attack: str, *, count: int | None = None,
              fraction: StaticFloat | None = None, ids: Sequence[int] | None = None,
              seed: int = 0,
              sigma: float = 1.0, epsilon: float = 0.1, z: float | None = None,
              mimic_warmup: int = 0, model=None) -> Algorithm:
    """``algorithm`` with Byzantine clients sending ``attack`` (one of ATTACKS): ``count`` of
    the population, or ``fraction`` of it, or the clients ``ids``, drawn from ``seed``.
    ``sigma``: the Gaussian attack's standard deviation; ``epsilon``: IPM's; ``z``: ALIE's
    (unset: the paper's, from the round's n and f). ``mimic_warmup``: 0 copies the round's
    honest client of lowest id; T >= 1 chooses whom to copy over the first T rounds as
    Karimireddy et al.'s code does (its default: 1). ``model`` (filled in by the experiment):
    its number of classes, for ``label_flip``."""
    if attack not in ATTACKS:
        raise FljaxError(f"byzantine: attack must be one of {ATTACKS}, got {attack!r}")
    given = [name for name, value in (("count", count), ("fraction", fraction), ("ids", ids))
             if value is not None]
    if len(given) != 1:
        raise FljaxError(f"byzantine: give exactly one of count, fraction and ids, got "
                         f"{given or 'none'}")
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 0):
        raise FljaxError(f"byzantine: count must be a whole number >= 0, got {count!r}")
    if fraction is not None and not (isinstance(fraction, (int, float)) and 0 <= fraction < 1):
        raise FljaxError(f"byzantine: fraction must be in [0, 1), got {fraction!r}")
    if ids is not None and not (isinstance(ids, (list, tuple)) and all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids)):
        raise FljaxError(f"byzantine: ids must be a list of client ids >= 0, got {ids!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise FljaxError(f"byzantine: seed must be a whole number >= 0, got {seed!r}")
    check("sigma", sigma, NON_NEGATIVE, ">= 0")
    check("epsilon", epsilon, NON_NEGATIVE, ">= 0")
    if isinstance(mimic_warmup, bool) or not isinstance(mimic_warmup, int) or mimic_warmup < 0:
        raise FljaxError(f"byzantine: mimic_warmup must be a whole number >= 0, got "
                         f"{mimic_warmup!r}")
    if mimic_warmup and attack != "mimic":
        raise FljaxError(f"byzantine: mimic_warmup is for attack 'mimic', got attack {attack!r}")
    if attack == "label_flip" and (model is None or getattr(model, "num_classes", None) is None):
        raise FljaxError("byzantine: label_flip needs the model (its number of classes)")
    if algorithm.cohort_start is not None:
        raise FljaxError(f"byzantine cannot wrap {algorithm.name}: its clients send a first "
                         f"message (cohort_start) that no attack would replace")

    def which(num_clients: int) -> jax.Array:
        """[N] bool: the Byzantine clients of the population."""
        if ids is not None:
            if max(ids, default=-1) >= num_clients:
                raise FljaxError(f"byzantine: ids must be below the {num_clients} clients, got "
                                 f"{max(ids)}")
            return jnp.zeros(num_clients, bool).at[jnp.asarray(ids, jnp.int32)].set(True)
        many = count if count is not None else int(round(fraction * num_clients))
        if many > num_clients:
            raise FljaxError(f"byzantine: count ({many}) must be <= the {num_clients} clients")
        return attacks.byzantine_ids(jax.random.PRNGKey(seed), num_clients, many)

    def client_loss(ctx: ClientContext, loss_fn):
        if attack != "label_flip":
            return algorithm.client_loss(ctx, loss_fn)
        bad = which(ctx.num_clients)[ctx.client_id]

        def flipped(params, x, y, *rest, **named):
            return loss_fn(params, x, jnp.where(bad, attacks.flip_labels(y, model.num_classes),
                                                y), *rest, **named)

        return algorithm.client_loss(ctx, flipped)

    def attacked(x, mask, bad, key, ids):
        if attack == "sign_flip":
            return attacks.sign_flip(x, mask, bad)
        if attack == "gaussian":
            return attacks.gaussian(x, mask, bad, key, sigma)
        if attack == "alie":
            return attacks.alie(x, mask, bad, z=z)
        if attack == "ipm":
            return attacks.inner_product_manipulation(x, mask, bad, epsilon)
        honest = mask & ~bad      # mimic the honest client of lowest id in the round: under
        slot = jnp.argmin(jnp.where(honest, ids, jnp.iinfo(jnp.int32).max))   # full
        before = jnp.arange(honest.shape[0]) < slot                       # participation, one
        return attacks.mimic(x, mask, bad, jnp.sum(honest & before))     # client


    def reduce(cohort: CohortMessages, bad: jax.Array):
        """The attacked cohort's message: the wrapped algorithm's aggregate, or sum_i p_i u_i."""
        if algorithm.aggregate is None:
            message, metrics = weighted_sum(cohort), {}
        else:
            message, metrics = algorithm.aggregate(cohort)
        return message, {**metrics, "byzantine_sampled": bad.sum().astype(jnp.float32)}

    def aggregate(cohort: CohortMessages):
        bad = which(cohort.num_clients)[cohort.ids] & cohort.joined
        attack_key, inner_key = jax.random.split(cohort.key)
        if attack != "label_flip":
            x, unravel = as_matrix(cohort.messages)
            x = attacked(x, cohort.joined, bad, attack_key, cohort.ids)
            cohort = cohort._replace(messages=jax.vmap(unravel)(x))
        return reduce(cohort._replace(key=inner_key), bad)

    name = f"{algorithm.name}+byzantine_{attack}"
    if not mimic_warmup:
        return algorithm._replace(name=name, client_loss=client_loss,
                                  client_end=unweighted_end(algorithm, "byzantine"),
                                  aggregate=aggregate, rebase=None)

    def server_init(params):
        flat = ravel_pytree(params)[0]
        start = jax.random.normal(jax.random.fold_in(jax.random.PRNGKey(seed),
                                                     MIMIC_START_STREAM), flat.shape, flat.dtype)
        return MimicState(algorithm.server_init(params), jnp.zeros_like(flat), start,
                          jnp.int32(0), jnp.int32(-1))

    def warmed_aggregate(cohort: CohortMessages):
        """The warm-up's step, then ``aggregate`` with mimic copying its target: the message is
        (the wrapped algorithm's message, the new MimicState less ``inner``)."""
        state = cohort.server_state
        bad = which(cohort.num_clients)[cohort.ids] & cohort.joined
        honest = cohort.joined & ~bad
        x, unravel = as_matrix(cohort.messages)
        mu, z, chosen = attacks.mimic_warmup(x, honest, state.mu, state.z, state.seen)
        warming = state.seen < mimic_warmup
        mu, z = jnp.where(warming, mu, state.mu), jnp.where(warming, z, state.z)
        # after the warm-up, z is fixed: the largest projection on it stands in for an absent target
        best = jnp.where(warming, chosen, jnp.argmax(jnp.where(honest, x @ z, -jnp.inf)))
        target = jnp.where(warming, cohort.ids[best], state.target)
        present = honest & (cohort.ids == target)
        slot = jnp.where(present.any(), jnp.argmax(present), best)
        rank = jnp.sum(honest & (jnp.arange(honest.shape[0]) < slot))
        attacked_rows = jax.vmap(unravel)(attacks.mimic(x, cohort.joined, bad, rank))
        message, metrics = reduce(cohort._replace(
            messages=attacked_rows, key=jax.random.split(cohort.key)[1],
            server_state=state.inner), bad)
        return (message, (mu, z, state.seen + 1, target)), {
            **metrics, "mimic_target": target.astype(jnp.float32)}

    def server_update(params, state: MimicState, message, round_index):
        message, (mu, z, seen, target) = message
        params, inner = algorithm.server_update(params, state.inner, message, round_index)
        return params, MimicState(inner, mu, z, seen, target)

    perturb = None
    if algorithm.perturb is not None:
        def perturb(message, state: MimicState, key):
            return algorithm.perturb(message[0], state.inner, key), message[1]

    return with_inner_server_state(
        algorithm, name=name, server_init=server_init, server_update=server_update,
        client_end=lambda ctx, start, end: unweighted_end(algorithm, "byzantine")(
            ctx._replace(server_state=ctx.server_state.inner), start, end),
        aggregate=warmed_aggregate, perturb=perturb, rebase=None)
