"""FedEM: federated EM over a mixture of M shared component models, with personal mixture weights.

Marfoq, Neglia, Bellet, Kameni, Vidal, "Federated Multi-Task Learning under a Mixture of
Distributions", NeurIPS 2021 (Algorithm 1, FedEM), FedDecay's baseline (M = 3).

The model is ``fljax.models.mixture(model, M)``: components h_1..h_M (global, averaged by the
server) and client i's weights pi_i (client state, uniform until it trains). In round t client i
receives the components w^t = (w_1..w_M) and

    E-step, over its n_i examples:  q_j(m) = pi_i,m exp(-l(h_m(w_m^t; x_j), y_j)) / sum_m' (...),
                                    pi_i <- (1/n_i) sum_j q_j
    M-step: K local steps of the local optimizer on (1/B) sum_{j in batch} sum_m q_j(m)
            l(h_m(y_m; x_j), y_j), the q_j of the E-step (components at w^t, the old pi_i);
    sends Delta_i = w^t - y_K on the components (nothing on the weights);

the server averages each component (FedAvg's rule with p_i, n_i-weighted in the paper). The
E-step's mean comes from the gradient of the mixture's mean cross-entropy with respect to log pi
(``fljax.models.mixture``: that gradient is pi / sum_m pi_m - (1/n_i) sum_j q_j, the first term
from the softmax's normalizer), one pass over the client's data; the M-step recomputes each batch's
q_j from w^t (one extra forward pass of each component per step, exactly the E-step's q). Labels per position (sequences) get a q each.

Evaluation: the global model is the mixture with uniform weights; a client's personal model is the
mixture with its own pi_i (a new user's: uniform), refreshed by one E-step on the user's training
split (``adapt``: how FedEM fits an unseen client's weights, and what FederatedScope's fine-tuning
of FedEM starts with) before any fine-tuning. Memory: M models on the server
and sent both ways each round (M x FedAvg's bytes), M weights per client. FederatedScope's trainer
simplifies the E-step to batch means and weights each component's batch loss by pi_m instead of
q_j(m); fljax follows the paper.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from fljax.algorithms.base import Algorithm, ClientContext, LocalSGD, tree_scale, tree_sub
from fljax.algorithms.fedavg import fedavg
from fljax.errors import FljaxError
from fljax.models.mixture import component_logits
from fljax.models.model import Model, label_weights


def fedem(local: LocalSGD | optax.GradientTransformation, model: Model, *,
          num_components: int = 3,
          server_optimizer: optax.GradientTransformation | None = None,
          name: str = "fedem") -> Algorithm:
    """FedEM training ``model``, a ``fljax.models.mixture`` of ``num_components`` (M)."""
    if model.component is None:
        raise FljaxError(f"fedem trains a mixture model: build it with "
                         f"fljax.models.mixture.mixture(model, {num_components}); got model "
                         f"{model.name!r}")
    components = jax.eval_shape(model.init, jax.random.key(0))["log_weights"].shape[0]
    if components != num_components:
        raise FljaxError(f"num_components ({num_components}) differs from the mixture model's "
                         f"{components} components")
    base = fedavg(local, server_optimizer, name=name)
    component = model.component

    def client_init(params):
        return params["log_weights"]

    def client_start(ctx: ClientContext, key):
        del key
        return e_step({**ctx.params, "log_weights": ctx.client_state}, ctx.full_gradient)

    def client_loss(ctx: ClientContext, loss_fn):
        del loss_fn

        def loss(params, x, y, mask, rng):
            # the responsibilities under the round's components in evaluation mode (no
            # dropout), as FedEM's code computes its sample weights (under model.eval())
            at_round = component_logits(component, ctx.params["components"], x, False, None, mask)
            trained = component_logits(component, params["components"], x, True, rng, mask)
            labels = jnp.broadcast_to(jnp.maximum(y, 0), at_round.shape[:-1])
            old = optax.softmax_cross_entropy_with_integer_labels(at_round, labels)   # [M, B..]
            losses = optax.softmax_cross_entropy_with_integer_labels(trained, labels)
            prior = ctx.client_state.reshape((-1,) + (1,) * (old.ndim - 1))
            q = jax.lax.stop_gradient(jax.nn.softmax(prior - old, axis=0))
            weights = label_weights(y, mask, losses.dtype)
            return (q * losses * weights).sum() / jnp.maximum(weights.sum(), 1.0)

        return loss

    def client_end(ctx: ClientContext, start, end):
        sent = {**end, "log_weights": ctx.params["log_weights"]}     # the weights stay here
        return start["log_weights"], tree_scale(ctx.weight, tree_sub(ctx.params, sent))

    def personal_model(params, server_state, log_weights):
        return {**params, "log_weights": log_weights}

    return base._replace(client_init=client_init, client_start=client_start,
                         client_loss=client_loss, client_end=client_end,
                         personal_model=personal_model, adapt=e_step)


def e_step(params, gradient):
    """The mixture ``params`` with log pi <- log (1/n) sum_j q_j, the responsibilities under the
    current components and weights over the examples whose mean loss ``gradient`` differentiates.
    The cross-entropy's softmax normalizes by sum_m pi_m, whose gradient adds softmax(log pi)."""
    weights = jax.nn.softmax(params["log_weights"]) - gradient(params)["log_weights"]
    return {**params, "log_weights": jnp.log(jnp.maximum(weights, 0.0))}
