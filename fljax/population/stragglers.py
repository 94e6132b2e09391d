"""Synchronous rounds under a clock: a deadline, stragglers, dropout and over-selection.

Given the round's cohort and each sampled client's duration d_i (``fljax.population.clock``):

- ``dropout`` q: each sampled client vanishes with probability q (drawn from the run's key, the
  round and its id) and never reports;
- ``over_selection`` o: the round samples ceil(m (1 + o)) clients and keeps the m that report
  first (Bonawitz et al., "Towards Federated Learning at Scale", 2019: deployments over-select
  and drop the slowest);
- ``deadline`` T: a client that would finish after T is a straggler. ``stragglers='drop'``: it
  is left out; ``'partial'``: it keeps the floor(K_i T / d_i) local steps it finished by T (the
  engine stops its local training there; FedNova normalizes by the steps each client took), and
  leaves out if that is none.

The clients that report are the round's cohort: their aggregation weights are renormalized over
them (n_i / sum over those that report, or 1 / their number); a client that does not report keeps
its state. If none reports the round changes nothing but the clock. The round lasts until the last
reporting client finishes, or until T when a straggler was cut off:

    round time = T if some sampled client was cut off by the deadline, else max over those that
    report of d_i   (0 if none).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from fljax.population.clock import CLOCK_STREAM, Clock
from fljax.population.cohort import Cohort, cohort_weights
from fljax.errors import FljaxError
from fljax.hyperparams import POSITIVE, check

STRAGGLERS = ("drop", "partial")
DROPOUT_STREAM = 0xD20B   # fold_in data of the dropout draws (beside the clock's)


class Deadline(NamedTuple):
    """What a synchronous round does with slow and vanishing clients (module docstring)."""

    seconds: float | None = None
    stragglers: str = "drop"
    dropout: float = 0.0
    over_selection: float = 0.0


def check_deadline(deadline: Deadline) -> Deadline:
    """Raise FljaxError naming a bad value; return ``deadline``."""
    if deadline.seconds is not None:
        check("deadline", deadline.seconds, POSITIVE, "> 0 and finite (clock units)")
    if deadline.stragglers not in STRAGGLERS:
        raise FljaxError(f"stragglers must be one of {STRAGGLERS}, got {deadline.stragglers!r}")
    check("dropout", deadline.dropout, lambda v: 0 <= v < 1, "in [0, 1)")
    check("over_selection", deadline.over_selection, lambda v: 0 <= v <= 10, "in [0, 10]")
    return deadline


def sampled(deadline: Deadline | None, clients_per_round: int) -> int:
    """The clients a round samples: ceil(m (1 + over_selection))."""
    if deadline is None or not deadline.over_selection:
        return clients_per_round
    return math.ceil(round(clients_per_round * (1 + deadline.over_selection), 9))


def settle(deadline: Deadline | None, clock: Clock, key: jax.Array, round_index: jax.Array,
           cohort: Cohort, steps: jax.Array, counts: jax.Array, aggregation: str,
           clients_per_round: int) -> tuple[Cohort, jax.Array, jax.Array]:
    """(the cohort of clients that report, with their weights renormalized; each slot's local
    steps (fewer for a partial straggler); the round's simulated duration). ``steps``: each
    slot's full local steps; ``counts``: the examples of each slot's client."""
    dtype = cohort.weights.dtype
    durations = clock.durations(key, round_index, cohort.ids, steps, dtype)
    report = cohort.joined
    deadline = deadline or Deadline()
    if deadline.dropout:
        draws = jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(
            key, CLOCK_STREAM), DROPOUT_STREAM), round_index)
        vanish = jax.vmap(lambda i: jax.random.uniform(jax.random.fold_in(draws, i)))(
            cohort.ids) < deadline.dropout
        report = report & ~vanish
    if deadline.over_selection:
        order = jnp.argsort(jnp.where(report, durations, jnp.inf), stable=True)
        rank = jnp.zeros_like(order).at[order].set(jnp.arange(order.shape[0]))
        report = report & (rank < clients_per_round)
    cut = jnp.zeros_like(report)
    if deadline.seconds is not None:
        late = durations > deadline.seconds
        cut = report & late
        if deadline.stragglers == "partial":
            done = jnp.floor(steps * (deadline.seconds / durations)).astype(steps.dtype)
            steps = jnp.where(late, done, steps)
            report = report & (steps > 0)
        else:
            report = report & ~late
    elapsed = jnp.where(jnp.any(cut), jnp.asarray(deadline.seconds or 0, dtype),
                        jnp.max(jnp.where(report, durations, 0)))
    weights = cohort_weights(counts, aggregation, dtype, report)
    weights = jnp.where(jnp.any(report), weights, 0)
    return Cohort(cohort.ids, report, weights, report.sum()), steps, elapsed
