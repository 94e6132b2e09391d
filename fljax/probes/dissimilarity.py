"""Client gradient dissimilarity at the global model (FedGA / GradAlign (Dandi, Barba and Jaggi,
AAAI 2022), section 3 and Figures 5, 7, 9): how far each client's full local gradient is from the
global one.

At the model after round t, x = w^{t+1}, with g_k(x) the gradient of client k's mean loss over all
its examples and p_k the aggregation weights over all N clients (n_k / n for 'examples': the
gradient of the mean loss over the whole training set; 1/N for 'uniform'):

    grad f(x) = sum_k p_k g_k(x)
    d_k(x)    = ||grad f(x) - g_k(x)||                           per client k
    r(x)      = 1/(2N) sum_k d_k(x)^2                            the variance regularizer r(x)

Metrics: ``gradient_variance`` (r), ``gradient_dissimilarity`` (mean_k d_k),
``gradient_dissimilarity_max``, and ``gradient_dissimilarity_first`` (d_0: the paper's figures plot
"the first client's"). The gradients are taken in evaluation mode (no dropout). Cost: two passes of
full-batch gradients over every client's data per round (one for grad f, one for the d_k); memory
one model.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fljax.probes.base import Probe, RoundView, squared_norm


def gradient_dissimilarity() -> Probe:
    """d_k = ||grad f(w) - g_k(w)|| over all clients at the new global model, and r(w)."""

    def server(view: RoundView):
        population, x = view.population, view.new_params
        clients = jnp.arange(population.num_clients)

        def add(total, client):
            g = population.gradient(client, x)
            return jax.tree.map(lambda t, gi: t + population.weights[client] * gi, total, g), None

        zeros = jax.tree.map(jnp.zeros_like, x)
        global_gradient, _ = jax.lax.scan(add, zeros, clients)

        def distance(client):
            g = population.gradient(client, x)
            return jnp.sqrt(squared_norm(jax.tree.map(jnp.subtract, global_gradient, g)))

        d = jax.lax.map(distance, clients)
        return view.state, {"gradient_variance": jnp.sum(d ** 2) / (2 * population.num_clients),
                            "gradient_dissimilarity": jnp.mean(d),
                            "gradient_dissimilarity_max": jnp.max(d),
                            "gradient_dissimilarity_first": d[0]}

    return Probe(name="gradient_dissimilarity", server=server)
