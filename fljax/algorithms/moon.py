"""MOON: model-contrastive federated learning.

Li, He, Song, "Model-Contrastive Federated Learning", CVPR 2021; official ``QinbinLi/MOON``
(``main.py:train_net_fedcon``, ``model.py:ModelFedCon``).

Client i, round t, local model y with projection z = R_y(x) (``with_projection_head``):

    z_glob = R_{w^t}(x)            the broadcast global model (eval mode, no gradient)
    z_prev = R_{y_i^prev}(x)       client i's own model at the end of its last round (no gradient)
    l_con  = -log( exp(cos(z, z_glob)/tau) / (exp(cos(z, z_glob)/tau) + exp(cos(z, z_prev)/tau)) )
    L      = CE(logits, y) + mu * l_con        (both averaged over the valid examples of the batch)

cos(a, b) = a.b / (max(||a||, 1e-8) max(||b||, 1e-8)) (torch's CosineSimilarity). After local
training the client keeps its final model as y_i^prev. The server is FedAvg (weighted by n_i in the
official code; any ``server_optimizer``).

The model passed here and to the engine must be the same one: ``with_projection_head(base)`` for
the official MOON; passing the plain base model contrasts its penultimate features instead (the
FedDecorr repository's MOON without ``--use_proj_head``).

Client state: y_i^prev, one model per client (memory N x model size). Its initialization:

* ``prev_init='random'`` (default, the official code with ``model_buffer_size=1``): the pool of
  previous models is empty in round 0, so the contrastive term is absent (l_con = CE of a single
  logit = 0) in round 0; from round 1 on, a client that has not trained yet contrasts with its own
  random initialization (``init_nets`` draws one per party), here ``model.init`` with the key
  ``fold_in(PRNGKey(prev_seed), client_id)``. (The code's ``load_first_net`` branch builds a pool
  but never stores it, so it has no effect.) That init is traced into the round program (under a
  ``lax.cond`` on the client's state), which lengthens its one-time compilation.
* ``prev_init='global'``: y_i^prev starts as the round-0 global model w^0 (in round 0 the term then
  equals log 2 with zero gradient).

Defaults: mu = 1 (the code's default; the paper uses 5 for CIFAR-10, 1 for CIFAR-100 and
Tiny-ImageNet), tau = 0.5. mu = 0 is FedAvg exactly. Not implemented: a pool of more than one
previous model (``model_buffer_size`` > 1).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fljax.algorithms.base import Algorithm, ClientContext, ClientOptimizer, LocalSGD, LossFn
from fljax.algorithms.fedavg import fedavg
from fljax.errors import FljaxError
from fljax.hyperparams import NON_NEGATIVE, POSITIVE, check
from fljax.models.model import Model, cross_entropy

PREV_INITS = ("random", "global")


class MoonState(NamedTuple):
    prev: Any            # y_i^prev: the client's model at the end of its last round
    trained: jax.Array   # shape=(), bool: whether the client has trained yet (prev is its own)


def cosine(a: jax.Array, b: jax.Array, eps: float = 1e-8) -> jax.Array:
    """Row-wise a.b / (max(||a||, eps) max(||b||, eps)) (torch.nn.CosineSimilarity(dim=-1))."""
    norm = lambda v: jnp.sqrt(jnp.maximum(jnp.sum(v * v, axis=-1), eps * eps))
    return jnp.sum(a * b, axis=-1) / (norm(a) * norm(b))


def moon(local: LocalSGD | optax.GradientTransformation | ClientOptimizer, model: Model, *,
         mu: float = 1.0, tau: float = 0.5, prev_init: str = "random", prev_seed: int = 0,
         server_optimizer: optax.GradientTransformation | None = None) -> Algorithm:
    """FedAvg with MOON's model-contrastive term on ``model``'s features (its projection)."""
    check("mu", mu, NON_NEGATIVE, "a finite number >= 0")
    check("tau", tau, POSITIVE, "a finite number > 0")
    if prev_init not in PREV_INITS:
        raise FljaxError(f"prev_init must be one of {PREV_INITS}, got {prev_init!r}")
    if not isinstance(prev_seed, int):
        raise FljaxError(f"prev_seed must be an integer, got {prev_seed!r}")
    base = fedavg(local, server_optimizer, name="moon")

    def client_init(params):
        return MoonState(prev=params, trained=jnp.zeros((), bool))

    def previous_model(ctx: ClientContext):
        state = ctx.client_state
        if prev_init == "global":
            return state.prev

        def own_init():
            fresh = model.init(jax.random.fold_in(jax.random.PRNGKey(prev_seed), ctx.client_id))
            return jax.tree.map(lambda f, p: f.astype(p.dtype), fresh, state.prev)

        return jax.lax.cond(state.trained, lambda: state.prev, own_init)

    def client_loss(ctx: ClientContext, loss_fn: LossFn) -> LossFn:
        del loss_fn  # replaced: CE and the contrastive term share one forward pass
        prev = previous_model(ctx)
        # 'random': no previous model in round 0 (the official pool is still empty).
        active = (ctx.round > 0) if prev_init == "random" else jnp.ones((), bool)

        def loss(params, x, y, mask, rng):
            z, logits = model.apply_with_features(params, x, train=True, rng=rng)
            z_glob = jax.lax.stop_gradient(model.apply_with_features(ctx.params, x)[0])
            z_prev = jax.lax.stop_gradient(model.apply_with_features(prev, x)[0])
            sims = jnp.stack([cosine(z, z_glob), cosine(z, z_prev)], axis=1) / tau
            contrastive = cross_entropy(sims, jnp.zeros(y.shape, jnp.int32), mask)
            return cross_entropy(logits, y, mask) + mu * jnp.where(active, contrastive, 0.0)

        return loss

    def client_end(ctx: ClientContext, start, end):
        _, message = base.client_end(ctx, start, end)
        return MoonState(prev=end, trained=jnp.ones((), bool)), message

    return base._replace(client_init=client_init, client_loss=client_loss, client_end=client_end)
