"""Cosine similarity of a client's pseudo-gradients across rounds (FedDyn as initialization
(Anonymous, 2024), section 3.2 and Figure 1c): high when a client "repeatedly optimizes only its
local objective".

The paper "measured the cosine similarity between a client's pseudo-gradient from the last round
and those from its previous rounds". Two probes:

* ``cosine_to(reference)``: that figure exactly. cos(Delta_k^t, r_k) for every sampled client k in
  round t, against a fixed per-client reference r_k: the pseudo-gradient of the LAST round of a
  first, identical run (fljax runs are deterministic, so the second run repeats the first while
  it measures). Take the reference from the first run's ``cosine_previous`` state with
  ``last_pseudo_gradients(state)``. Memory: one model per client (N x params), as the reference.
* ``cosine_previous()``: one pass, the cheaper variant: cos(Delta_k^t, Delta_k^{prev}) against the
  client's previous participation (the previous round under full participation). Memory: one
  model per client (N x params) for the previous pseudo-gradient, plus a flag.

Both report the mean over the cohort's clients that have something to compare with; clients with
none (a first participation, a zero reference) are left out; NaN when no client has.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from fljax.algorithms.base import Params
from fljax.errors import FljaxError
from fljax.probes.base import ClientView, Probe, RoundView, squared_norm, stacked, tree_dot


def cosine(a: Params, b: Params) -> jax.Array:
    """<a, b> / (||a|| ||b||) over all leaves (0 when either is 0)."""
    norms = jnp.sqrt(squared_norm(a) * squared_norm(b))
    return jnp.where(norms > 0, tree_dot(a, b) / jnp.where(norms > 0, norms, 1.0), 0.0)


def mean_over_counted(view: RoundView, name: str) -> tuple:
    total, count = view.summed
    return view.state, {name: jnp.where(count > 0, total / jnp.maximum(count, 1), jnp.nan)}


class PreviousPseudoGradient(NamedTuple):
    delta: Params        # the client's pseudo-gradient at its last participation (0 before)
    seen: jax.Array      # shape=(), bool: it took part before


def cosine_previous() -> Probe:
    """Mean over the cohort of cos(Delta_k^t, Delta_k^{prev}); metric ``cosine_previous``."""

    def init(params, num_clients):
        zero = PreviousPseudoGradient(jax.tree.map(jnp.zeros_like, params),
                                      jnp.zeros((), bool))
        return (), stacked(num_clients, zero)

    def client(view: ClientView):
        delta = view.pseudo_gradient
        seen = view.state.seen
        value = jnp.where(seen, cosine(delta, view.state.delta), 0.0)
        return (PreviousPseudoGradient(delta, jnp.ones((), bool)),
                (value, seen.astype(value.dtype)))

    return Probe(name="cosine_previous", init=init, client=client,
                 server=lambda view: mean_over_counted(view, "cosine_previous"))


def cosine_to(reference: Params) -> Probe:
    """Mean over the cohort of cos(Delta_k^t, reference[k]); metric ``cosine_to_reference``.
    ``reference`` holds one pseudo-gradient per client, stacked over all N clients."""

    def init(params, num_clients):
        rows = {leaf.shape[0] for leaf in jax.tree.leaves(reference)}
        if rows != {num_clients} or jax.tree.structure(reference) != jax.tree.structure(params):
            raise FljaxError(f"cosine_to: the reference must hold one model-shaped vector per "
                             f"client ({num_clients} rows), got rows {sorted(rows)}")
        return (), jax.tree.map(lambda r, p: jnp.array(r, p.dtype), reference, params)

    def client(view: ClientView):
        counted = squared_norm(view.state) > 0
        value = jnp.where(counted, cosine(view.pseudo_gradient, view.state), 0.0)
        return view.state, (value, counted.astype(value.dtype))

    return Probe(name="cosine_to", init=init, client=client,
                 server=lambda view: mean_over_counted(view, "cosine_to_reference"))


def last_pseudo_gradients(state) -> Params:
    """Every client's latest pseudo-gradient, from a RoundState run with ``cosine_previous``
    (under full participation: the last round's), stacked over N: a ``cosine_to`` reference."""
    return jax.tree.map(jnp.asarray, state.probes["cosine_previous"][1].delta)
