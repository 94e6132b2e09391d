"""FedInit's divergence term over ALL clients (FedInit (Sun, Shen and Tao, NeurIPS 2023), Theorem 3
and Table 3).

    Delta^{t+1} = 1/N sum_{i=1..N} ||y_i^{latest} - w^{t+1}||^2

where y_i^{latest} is client i's latest local model (w^0 until it first trains) and w^{t+1} the
model the server broadcasts next: the paper's divergence between the clients' last local models
and the global model, which bounds FedInit's excess risk. The relaxed_init wrapper's own
``divergence`` metric is its unbiased estimate from one round's cohort (before training); this
probe computes the sum over every client, for any algorithm. Cost: one model per client (N x
params, as ``all_model``), one pass over them per round.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fljax.probes.base import ClientView, Probe, RoundView, stacked


def divergence() -> Probe:
    """``divergence_all``: Delta^{t+1} over all N clients' latest local models."""

    def init(params, num_clients):
        return (), stacked(num_clients, params)

    def client(view: ClientView):
        return view.end, ()

    def server(view: RoundView):
        per_client = sum(jnp.sum(jnp.square(latest - w[None]), axis=tuple(range(1, latest.ndim)))
                         for latest, w in zip(jax.tree.leaves(view.client_probe_states),
                                              jax.tree.leaves(view.new_params)))
        return view.state, {"divergence_all": jnp.mean(per_client)}

    return Probe(name="divergence", init=init, client=client, server=server)
