"""A mixture of M copies of a model (FedEM's hypothesis): p(y | x) = sum_m pi_m p_m(y | x).

Parameters: ``{"components": the M component models' parameters stacked on a leading axis,
"log_weights": log pi, shape [M]}``. The logits are the mixture's log-probabilities,

    logits(x) = logsumexp_m ( log pi_m + log_softmax(h_m(x)) ),

so the softmax cross-entropy of these logits is the mixture's negative log-likelihood
-log sum_m pi_m p_m(y | x), and its gradient with respect to log pi_m is -q_m(x, y), the posterior
responsibility of component m (what FedEM's E-step averages). Components are initialised from
independent keys (identical components would stay identical); pi starts uniform.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fljax.errors import FljaxError
from fljax.models.model import Model, Params


def component_logits(model: Model, components: Params, x, train: bool = False, rng=None,
                     mask=None) -> jax.Array:
    """[M, batch, ..., C]: every component's logits on ``x``."""
    return jax.vmap(lambda p: model.apply(p, x, train=train, rng=rng, mask=mask))(components)


def mixture(model: Model, num_components: int) -> Model:
    """``model`` as a mixture of ``num_components`` copies (``Model.component`` is ``model``)."""
    if isinstance(num_components, bool) or not isinstance(num_components, int) \
            or num_components < 1:
        raise FljaxError(f"num_components must be an integer >= 1, got {num_components!r}")
    if model.component is not None:
        raise FljaxError(f"model {model.name!r} is already a mixture")

    def init(key):
        components = jax.vmap(model.init)(jax.random.split(key, num_components))
        dtype = jax.tree.leaves(components)[0].dtype
        return {"components": components,
                "log_weights": jnp.full(num_components, -jnp.log(num_components), dtype)}

    def apply(params, x, train=False, rng=None, mask=None):
        logits = component_logits(model, params["components"], x, train, rng, mask)
        log_weights = params["log_weights"].reshape((-1,) + (1,) * (logits.ndim - 1))
        return jax.nn.logsumexp(log_weights + jax.nn.log_softmax(logits), axis=0)

    def apply_with_features(params, x, train=False, rng=None):
        raise FljaxError("a mixture model has no single feature representation")

    def update_state(params, x, rng=None, mask=None):
        components = jax.vmap(lambda p: model.update_state(p, x, rng, mask))(
            params["components"])
        return {**params, "components": components}

    stateful = model.state_mask is not None
    return Model(f"{model.name}x{num_components}", init, apply, apply_with_features,
                 ("components", "log_weights"), model.input_spec, model.num_classes,
                 {"components": model.state_mask, "log_weights": False} if stateful else None,
                 update_state if stateful else None, component=model)
