"""Gradient diversity (Yin et al. 2018; FedDyn as initialization (Anonymous, 2024) Eq. (1)) of the
cohort's pseudo-gradients and of any per-client vector an algorithm keeps (FedDyn's local drift,
SCAFFOLD's control variates).

    diversity({v_k}) = sum_k ||v_k||^2 / ||sum_k v_k||^2

For n vectors it is 1/n when they are all equal (its minimum, by Cauchy-Schwarz), 1 when they
are orthogonal with any norms, and grows without bound as they cancel each other. The sums are
unweighted, as in Eq. (1).
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp

from fljax.errors import FljaxError
from fljax.probes.base import ClientView, Probe, RoundView, squared_norm


def diversity(sum_of_squares: jax.Array, sum_vector) -> jax.Array:
    """sum_k ||v_k||^2 / ||sum_k v_k||^2; NaN when every v_k is 0."""
    total = squared_norm(sum_vector)
    return jnp.where(total > 0, sum_of_squares / jnp.where(total > 0, total, 1.0), jnp.nan)


def pseudo_gradient_diversity() -> Probe:
    """Eq. (1) over the cohort's pseudo-gradients Delta_k = w^t - y_k,K (the update against the
    broadcast model, whatever the algorithm's start: +RI and FedGA clients start elsewhere).
    Metric ``pseudo_gradient_diversity``; the paper's Figures 1b, 6c, 10a, 11, 13a use full
    participation, where the cohort is every client. Costs one model-sized sum per round."""

    def client(view: ClientView):
        delta = view.pseudo_gradient
        return view.state, (squared_norm(delta), delta)

    def server(view: RoundView):
        sum_of_squares, total = view.summed
        return view.state, {"pseudo_gradient_diversity": diversity(sum_of_squares, total)}

    return Probe(name="pseudo_gradient_diversity", client=client, server=server)


def state_diversity(names: Sequence[str] | None = None) -> Probe:
    """Eq. (1) over every client's vectors that the algorithm exposes (``client_vectors``), after
    the round, over ALL N clients: FedDyn's local drift grad L_k(theta_k) = -alpha_k h_k
    (``local_drift_diversity``, Figures 6d, 10b, 11, 13b), SCAFFOLD's control variates
    (``control_variate_diversity``, Figure 6d). A client never sampled holds its initial
    vector (0 for both) and adds nothing to either sum; under full participation the set is the
    cohort, as in the paper. ``names`` selects vectors (default: all exposed). Costs one pass
    over the N stored states per round."""

    def server(view: RoundView):
        exposed = jax.eval_shape(view.client_vectors, jnp.zeros((), jnp.int32))
        wanted = list(exposed) if names is None else list(names)
        missing = sorted(set(wanted) - set(exposed))
        if not wanted or missing:
            raise FljaxError(f"state_diversity: algorithm {view.algorithm.name!r} exposes per-client "
                             f"vectors {sorted(exposed)} (client_vectors), asked for "
                             f"{wanted or 'any'}; FedDyn exposes 'local_drift', SCAFFOLD "
                             f"'control_variate'")

        def add(totals, client):
            vectors = view.client_vectors(client)
            return {name: (totals[name][0] + squared_norm(vectors[name]),
                           jax.tree.map(jnp.add, totals[name][1], vectors[name]))
                    for name in wanted}, None

        zeros = {name: (jnp.zeros((), jax.tree.leaves(exposed[name])[0].dtype),
                        jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), exposed[name]))
                 for name in wanted}
        totals, _ = jax.lax.scan(add, zeros, jnp.arange(view.population.num_clients))
        return view.state, {f"{name}_diversity": diversity(*totals[name]) for name in wanted}

    return Probe(name="state_diversity", server=server)
