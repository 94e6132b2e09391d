"""Layers that never leave the client: FedBN, and any other leaves an algorithm keeps local.

Li, Jiang, Zhang, Kamp, Dou, "FedBN: Federated Learning on Non-IID Features via Local Batch
Normalization", ICLR 2021 (FedDecay's baseline, FederatedScope ``personalization.local_param =
['bn', 'norms']``): every client keeps its own normalization layers (BatchNorm's scale, bias and
running statistics; FederatedScope's name rule also keeps LayerNorms local, e.g. BERT's on SST2);
the server aggregates everything else. ``local_layers(algorithm, local)``
does this for ANY algorithm and any static mask ``local`` (True: the leaf stays local). Client i
keeps its own values v_i of the local leaves (initially those of w^0) and combines them with the
broadcast model: the wrapped algorithm runs as if the server had sent

    w_i^t = w^t on the shared leaves, v_i on the local leaves          (its ``ctx.params``)

so its start, corrections and proximal centre are the client's own model; after local training
v_i <- y_i,K on the local leaves, and the wrapped algorithm's ``client_end`` is shown y_i,K with
w_i^t on the local leaves: the local leaves never leave the client, and the server sees no change
there, so its values stay those of w^0 (FederatedScope's FedBN never aggregates them). The
global model is thus the shared layers with the initial normalization; FedBN's paper scores each
client with its own model: ``personal_model`` is the wrapped algorithm's (or the global model)
with the client's local leaves, what the personalized evaluation scores. Memory: one copy of
the local leaves per client (N x the BN parameters and statistics).
"""

from __future__ import annotations

import jax
from flax.traverse_util import flatten_dict, unflatten_dict

from fljax.algorithms.base import Algorithm, ClientContext, Params
from fljax.errors import FljaxError


def _own(local: Params, tree: Params) -> Params:
    """``tree`` on the local leaves, None (an empty subtree) on the shared ones."""
    return jax.tree.map(lambda keep, leaf: leaf if keep else None, local, tree)


def _with_own(local: Params, tree: Params, own: Params) -> Params:
    """``tree`` with ``own`` on the local leaves."""
    return jax.tree.map(lambda keep, leaf, mine: mine if keep else leaf, local, tree, own)


def local_layers(algorithm: Algorithm, local: Params, name: str | None = None) -> Algorithm:
    """``algorithm`` whose clients keep their own values of the leaves marked True in ``local``
    (a tree of Python bools shaped like the params)."""
    if not isinstance(algorithm, Algorithm):
        raise FljaxError(f"local_layers wraps an Algorithm, got {type(algorithm).__name__}")
    if not any(jax.tree.leaves(local)):
        raise FljaxError("local_layers needs at least one local leaf; the mask marks none")

    def inner(ctx: ClientContext) -> ClientContext:
        state, own = ctx.client_state
        return ctx._replace(client_state=state, params=_with_own(local, ctx.params, own))

    def client_init(params):
        return algorithm.client_init(params), _own(local, params)

    def client_end(ctx, start, end):
        ctx = inner(ctx)
        shown = _with_own(local, end, _own(local, ctx.params))     # no change on local leaves
        state, message = algorithm.client_end(ctx, start, shown)
        return (state, _own(local, end)), message

    def personal_model(params, server_state, client_state):
        state, own = client_state
        inner_model = (params if algorithm.personal_model is None else
                       algorithm.personal_model(params, server_state, state))
        return _with_own(local, inner_model, own)

    return algorithm._replace(
        name=name or f"{algorithm.name}+local_layers", client_init=client_init,
        personal_model=personal_model,
        client_start=lambda ctx, key: algorithm.client_start(inner(ctx), key),
        client_end=client_end, rebase=None,
        client_tx=lambda ctx: algorithm.client_tx(inner(ctx)),
        client_loss=lambda ctx, loss_fn: algorithm.client_loss(inner(ctx), loss_fn),
        client_metrics=lambda ctx, start, end: algorithm.client_metrics(inner(ctx), start, end),
        client_vectors=lambda ctx: algorithm.client_vectors(inner(ctx)),
        cohort_start=None if algorithm.cohort_start is None else (
            lambda ctx: algorithm.cohort_start(inner(ctx))))


NORMALIZATION_NAMES = ("bn", "norm")   # FederatedScope's FedBN: local_param = ['bn', 'norms']


def normalization_layers(params: Params) -> Params:
    """True on every leaf of a normalization layer: a module whose name contains 'bn' or 'norm'
    (FederatedScope's substring rule; BatchNorm's scale, bias and running statistics, and
    LayerNorm's scale and bias, e.g. the transformer's)."""
    flat = flatten_dict(params)
    local = {path: any(word in str(key).lower() for key in path[:-1]
                       for word in NORMALIZATION_NAMES) for path in flat}
    if not any(local.values()):
        raise FljaxError(f"FedBN needs normalization layers (a module named with 'bn' or "
                         f"'norm'); this model has none: {sorted({p[0] for p in flat})}")
    return unflatten_dict(local)


def fedbn(algorithm: Algorithm, params: Params) -> Algorithm:
    """FedBN: ``algorithm`` with every normalization layer of the model local (``params``: the
    model's parameters or their shapes, ``jax.eval_shape(model.init, key)``)."""
    return local_layers(algorithm, normalization_layers(params), name=f"{algorithm.name}+fedbn")
