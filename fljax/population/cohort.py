"""Who takes part in a round: the cohort, its aggregation weights and every client's keys.

All randomness of round t derives from ``fold_in(root key, t)``, so a resumed run samples exactly
the clients and batches of an uninterrupted one.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

AGGREGATIONS = ("examples", "uniform")
PARTICIPATIONS = ("uniform", "bernoulli")


class Cohort(NamedTuple):
    """The slots of a round: ``ids[s]`` is the client in slot s, ``joined[s]`` whether it takes
    part (always True under uniform sampling), ``weights[s]`` its p_i (0 when it does not)."""

    ids: jax.Array       # [slots] int32
    joined: jax.Array    # [slots] bool
    weights: jax.Array   # [slots] float: sum to 1 over the slots that joined
    size: jax.Array      # shape=(), int32: |S^t|


SERVER_STREAM = 0x5E4E   # fold_in data of the server's key, beside round_key's split


def round_key(key: jax.Array, round_index: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(cohort key, client key) of round t, derived from the root key only."""
    sample_key, client_key = jax.random.split(jax.random.fold_in(key, round_index))
    return sample_key, client_key


def server_key(key: jax.Array, round_index: jax.Array) -> jax.Array:
    """The key of round t's server-side randomness (``Algorithm.perturb``), derived from the
    root key only: independent of the cohort and client keys."""
    return jax.random.fold_in(jax.random.fold_in(key, round_index), SERVER_STREAM)


def client_keys(client_key: jax.Array, client_id: jax.Array) -> jax.Array:
    """(start, batch, step) keys of one client in a round: depend on the client id, not on the
    client's slot in the cohort or the device it runs on."""
    return jax.random.split(jax.random.fold_in(client_key, client_id), 3)


MESSAGE_STREAM = 0x3E55   # fold_in data of the message keys, beside client_keys' split


def message_keys(client_key: jax.Array, client_id: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(the client's own message key, the round's shared key) from round t's client key: for
    randomness in what a client sends (``ClientContext.message_key``, ``.shared_key``),
    independent of its start, batch and step keys."""
    shared = jax.random.fold_in(client_key, MESSAGE_STREAM)
    return jax.random.fold_in(shared, client_id), shared


def stream_keys(batch_key: jax.Array, step_key: jax.Array, stream: int):
    """(batch, step) keys of a client's extra local loop number ``stream`` >= 1 in a round
    (``ClientContext.train``): independent of the round's own draw (stream 0, the keys
    themselves)."""
    return jax.random.fold_in(batch_key, stream), jax.random.fold_in(step_key, stream)


def sample_cohort(key: jax.Array, num_clients: int, cohort_size: int) -> jax.Array:
    """A uniformly random set of ``cohort_size`` distinct client ids, ascending, in O(C^2) work
    whatever N: Floyd's algorithm. For j = N-C, ..., N-1 draw t uniform in [0, j]; add t, or j
    if t was taken already. Every C-subset comes out with probability 1 / binom(N, C).

    Ids are int32, and t is drawn as int32, whether or not ``jax_enable_x64`` is on: under it
    the loop index k, so j, is int64, and an int64 draw would take other random bits; so x64 runs
    sample the clients of float32 runs (and the program of a float32 run is unchanged)."""
    first = num_clients - cohort_size

    def add(k, chosen):
        j = first + k
        t = jax.random.randint(jax.random.fold_in(key, k), (), 0, j + 1, dtype=chosen.dtype)
        taken = jnp.any((chosen == t) & (jnp.arange(cohort_size) < k))
        return chosen.at[k].set(jnp.where(taken, j, t).astype(chosen.dtype))

    chosen = jax.lax.fori_loop(0, cohort_size, add, jnp.zeros(cohort_size, jnp.int32))
    return jnp.sort(chosen)


def bernoulli_cohort(key: jax.Array, num_clients: int, rate: float,
                     num_devices: int = 1) -> tuple[jax.Array, jax.Array]:
    """The FedDyn code's participation: each client joins independently with probability
    ``rate``, and the draw is repeated (the key folded with the attempt) while nobody joined.

    Returns (ids, joined) over all N clients: those who joined first, ascending, then the others.
    Over D devices, each of the D equal shares of slots holds its device's own clients
    ([d N/D, (d+1) N/D), where they live: ``fljax.core.placement``), ordered so."""
    def draw(attempt):
        return jax.random.uniform(jax.random.fold_in(key, attempt), (num_clients,)) < rate

    _, joined = jax.lax.while_loop(lambda c: ~jnp.any(c[1]),
                                   lambda c: (c[0] + 1, draw(c[0] + 1)), (0, draw(0)))
    per_device = num_clients // num_devices
    blocks = jnp.argsort(~joined.reshape(num_devices, per_device), axis=1, stable=True)
    ids = (blocks + per_device * jnp.arange(num_devices)[:, None]).reshape(-1).astype(jnp.int32)
    return ids, joined[ids]


def cohort_weights(counts: jax.Array, aggregation: str, dtype,
                   joined: jax.Array | None = None) -> jax.Array:
    """p_i: n_i / sum_S n_j ('examples') or 1/|S| ('uniform'); 0 where ``joined`` is False."""
    if joined is not None:
        joined = joined.astype(dtype)
        if aggregation == "uniform":
            return joined / joined.sum()
        counts = counts * joined
    elif aggregation == "uniform":
        return jnp.full(counts.shape, 1.0 / counts.shape[0], dtype)
    counts = counts.astype(dtype)
    return counts / counts.sum()


def draw_cohort(key: jax.Array, counts: jax.Array, *, clients_per_round: int, participation: str,
                aggregation: str, dtype, num_devices: int) -> Cohort:
    """Round t's cohort from its cohort key: ``clients_per_round`` distinct clients ('uniform'),
    or each of the N clients with probability clients_per_round / N ('bernoulli')."""
    num_clients = counts.shape[0]
    if participation == "bernoulli":
        ids, joined = bernoulli_cohort(key, num_clients, clients_per_round / num_clients,
                                       num_devices)
        size = joined.sum()
        return Cohort(ids, joined, cohort_weights(counts[ids], aggregation, dtype, joined), size)
    ids = sample_cohort(key, num_clients, clients_per_round)
    joined, size = jnp.ones(clients_per_round, bool), jnp.asarray(clients_per_round)
    return Cohort(ids, joined, cohort_weights(counts[ids], aggregation, dtype), size)
