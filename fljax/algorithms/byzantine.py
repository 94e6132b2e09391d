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
al. 2020: -epsilon times the honest mean), ``mimic`` (Karimireddy et al. 2022: a copy of the update
of the round's honest client of lowest id, so one fixed client under full participation; the
paper's warm-up choice of whom to copy, by the direction of largest variance, is not
implemented), ``label_flip``.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp

from fljax.robustness import attacks
from fljax.algorithms.base import Algorithm, ClientContext, CohortMessages
from fljax.algorithms.compress import StaticFloat
from fljax.algorithms.robust import as_matrix, unweighted_end, weighted_sum
from fljax.errors import FljaxError
from fljax.hyperparams import NON_NEGATIVE, check

ATTACKS = ("sign_flip", "gaussian", "alie", "ipm", "mimic", "label_flip")


def byzantine(algorithm: Algorithm, attack: str, *, count: int | None = None,
              fraction: StaticFloat | None = None, ids: Sequence[int] | None = None,
              seed: int = 0,
              sigma: float = 1.0, epsilon: float = 0.1, z: float | None = None,
              model=None) -> Algorithm:
    """``algorithm`` with Byzantine clients sending ``attack`` (one of ATTACKS): ``count`` of
    the population, or ``fraction`` of it, or the clients ``ids``, drawn from ``seed``.
    ``sigma``: the Gaussian attack's standard deviation; ``epsilon``: IPM's; ``z``: ALIE's
    (unset: the paper's, from the round's n and f). ``model`` (filled in by the experiment):
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


    def aggregate(cohort: CohortMessages):
        bad = which(cohort.num_clients)[cohort.ids] & cohort.joined
        attack_key, inner_key = jax.random.split(cohort.key)
        if attack != "label_flip":
            x, unravel = as_matrix(cohort.messages)
            x = attacked(x, cohort.joined, bad, attack_key, cohort.ids)
            cohort = cohort._replace(messages=jax.vmap(unravel)(x))
        cohort = cohort._replace(key=inner_key)
        if algorithm.aggregate is None:
            message, metrics = weighted_sum(cohort), {}
        else:
            message, metrics = algorithm.aggregate(cohort)
        return message, {**metrics, "byzantine_sampled": bad.sum().astype(jnp.float32)}

    return algorithm._replace(name=f"{algorithm.name}+byzantine_{attack}",
                              client_loss=client_loss,
                              client_end=unweighted_end(algorithm, "byzantine"),
                              aggregate=aggregate, rebase=None)
