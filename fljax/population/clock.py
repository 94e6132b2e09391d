"""Simulated time: how long each client's local work takes (the clock model of FedScale and FLSim).

Client k's local step takes tau_k time units: a speed drawn once per run from a seeded log-normal,

    tau_k = exp(sigma z_k),        z_k ~ N(0, 1)     (median 1 unit per step; heavy-tailed in sigma)

or read from a trace (``step_times``: one positive number per client, e.g. measured device speeds).
In the round (or server step) t a client's work of K_k,t local steps takes

    d_k,t = K_k,t tau_k exp(jitter e_k,t),    e_k,t ~ N(0, 1),

so a client is steadily slow or fast (sigma) and varies from round to round (jitter). Every draw
derives from the run's key (``fold_in`` with CLOCK_STREAM, then the round and the client id), so a
resumed run sees the same durations and a client's duration does not depend on who else was
sampled.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fljax.errors import FljaxError
from fljax.hyperparams import NON_NEGATIVE, check

CLOCK_STREAM = 0xC10C   # fold_in data of the clock's keys


class Clock(NamedTuple):
    """The clock model (module docstring): log-normal speeds of spread ``sigma``, or per-client
    ``step_times`` from a trace; per-round log-normal ``jitter``."""

    sigma: float = 0.0
    jitter: float = 0.0
    step_times: tuple[float, ...] | None = None

    def step_time(self, key: jax.Array, ids: jax.Array, dtype=jnp.float32) -> jax.Array:
        """tau_k of the clients ``ids``."""
        if self.step_times is not None:
            return jnp.asarray(np.asarray(self.step_times), dtype)[ids]
        z = jax.vmap(lambda k: jax.random.normal(
            jax.random.fold_in(jax.random.fold_in(key, CLOCK_STREAM), k), (), dtype))(ids)
        return jnp.exp(self.sigma * z)

    def durations(self, key: jax.Array, round_index: jax.Array, ids: jax.Array,
                  steps: jax.Array, dtype=jnp.float32) -> jax.Array:
        """d_k,t = K_k,t tau_k exp(jitter e_k,t) of the clients ``ids`` taking ``steps`` steps in
        round (or server step) t (``round_index``: one, or one per client); ``key``: the run's
        root key."""
        tau = self.step_time(key, ids, dtype)
        base = jax.random.fold_in(key, CLOCK_STREAM)
        rounds = jnp.broadcast_to(round_index, ids.shape)
        e = jax.vmap(lambda t, i: jax.random.normal(
            jax.random.fold_in(jax.random.fold_in(base, t), i), (), dtype))(rounds, ids)
        return steps.astype(dtype) * tau * jnp.exp(self.jitter * e)


def make_clock(sigma: float = 0.0, jitter: float = 0.0,
               step_times: Sequence[float] | None = None, num_clients: int | None = None
               ) -> Clock:
    """A Clock, its values checked: ``sigma`` and ``jitter`` >= 0; ``step_times`` (with
    ``num_clients`` to check against) positive and one per client."""
    check("sigma", sigma, NON_NEGATIVE, ">= 0 and finite")
    check("jitter", jitter, NON_NEGATIVE, ">= 0 and finite")
    if step_times is not None:
        times = np.asarray(step_times, float)
        if times.ndim != 1 or not np.all(np.isfinite(times)) or np.any(times <= 0):
            raise FljaxError("step_times must be a list of positive finite numbers, one per "
                             "client")
        if num_clients is not None and len(times) != num_clients:
            raise FljaxError(f"step_times lists {len(times)} clients; the run has "
                             f"{num_clients}")
        if sigma:
            raise FljaxError("step_times (a trace) and sigma (drawn speeds) both set the "
                             "clients' speeds; give one")
        return Clock(0.0, float(jitter), tuple(float(t) for t in times))
    return Clock(float(sigma), float(jitter))
