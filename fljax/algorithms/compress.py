"""Compressed uplink: every client message of any algorithm encoded by a compressor
(``fljax.compression``), with optional error feedback; bits counted exactly.

For a sampled client i with message m_i (the wrapped algorithm's, already scaled by its
aggregation weight p_i), each floating tensor m of the message with more than one entry is sent
as C(m) (one-entry tensors, such as FedExP's norms, go as they are). With ``error_feedback``
(Stich et al. 2018; Karimireddy et al. 2019, EF-signSGD) the client keeps a residual e per tensor
and sends

    x = m + p_i e,     C(x),     e <- (x - C(x)) / p_i,

so that sent + p_i (new residual) = message + p_i (old residual) exactly. The residual is kept per
unit of p_i: a model update m = p_i Delta_i carries the unweighted Delta_i - C(...) / p_i over to
the client's next round whatever its weight then (every compressor here is positively
homogeneous, C(p x) = p C(x) with the same randomness). A message part not scaled by p_i
(SCAFFOLD's control-variate increment (c_i+ - c_i) / N) is compressed too; its residual is carried
exactly when p_i is the same in each round the client joins (uniform aggregation and a fixed
cohort, SCAFFOLD's setting), else rescaled by p_i(new) / p_i(old). Residuals start at 0 and
change only in the rounds the client joins.

Over ``robust`` or ``byzantine`` (the config's order: compress outside them), the clients'
unweighted updates are compressed, and the rule (and an attack's view of the honest updates) sees
the decoded messages side by side, as the server would; the residual is kept per unit of the
update (p_i = 1 above).

A first exchange (``cohort_start``, FedGA's full gradients) is compressed as well, without error
feedback. The downlink (the broadcast model) is not compressed: under partial participation a
returning client needs the model itself, not the last round's compressed change.

Randomness: the client's own key (``ctx.message_key``) and the round's shared key
(``ctx.shared_key``, e.g. the Hadamard rotation), one fold per tensor.

Bits (``message_bits``): per participating client, the uplink is the sum over the message's
tensors of the compressor's encoded size (``Compressor.bits``), one-entry tensors at their own
width; the downlink is the uncompressed ``payload`` copies of the model.

With DP: wrap ``dp`` around ``compress`` (``dp(compress(...))``, the config's order): the client
clips its compressed update, so the clipped sum keeps sensitivity C and the accountant's guarantee
holds (QSGD can lengthen a vector, so clipping before compressing would not bound it). The
residual never leaves the client. ``compress`` refuses an algorithm that already adds server
noise.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fljax.accounting import param_bits
from fljax.algorithms.base import Algorithm, ClientContext, Params
from fljax.compression import Compressor, make
from fljax.errors import FljaxError

StaticFloat = float   # a number that sets a shape (top-k's k): structure, never traced
FIRST = 0xF125        # fold_in data of a first exchange's keys


class FeedbackClientState(NamedTuple):
    inner: Any          # the wrapped algorithm's client state
    residual: tuple     # e of each compressed tensor of the message, per unit of p_i


def compressed(leaf) -> bool:
    """Whether a message tensor is compressed: floating, with more than one entry."""
    return jnp.issubdtype(leaf.dtype, jnp.floating) and leaf.size > 1


def stand_in_context(algorithm: Algorithm, params: Params) -> ClientContext:
    """A client context with the shapes of a real one (for ``jax.eval_shape`` only)."""
    dtype = jax.tree.leaves(params)[0].dtype
    one = jnp.ones((), jnp.int32)
    ctx = ClientContext(
        params=params, server_state=algorithm.server_init(params),
        client_state=algorithm.client_init(params), round=0 * one, client_id=0 * one,
        weight=jnp.ones((), dtype), cohort_size=1, num_clients=1, num_examples=one,
        mean_examples=jnp.ones((), dtype), num_steps=one, max_steps=1, steps_per_epoch=one,
        full_gradient=lambda at: at, train=lambda tx, start, stream, loss=None: start,
        message_key=jax.random.key(0), shared_key=jax.random.key(1))
    if algorithm.cohort_start is not None:
        first = algorithm.cohort_start(ctx)
        ctx = ctx._replace(cohort_message=first, own_message=first)
    return ctx


def messages(algorithm: Algorithm, params: Params) -> tuple[Any, Any]:
    """(first-exchange message or (), message) of ``algorithm`` as shapes and dtypes."""
    def both(params):
        ctx = stand_in_context(algorithm, params)
        _, message = algorithm.client_end(ctx, params, params)
        return ctx.own_message, message
    return jax.eval_shape(both, params)


def encoded_bits(codec: Compressor, message) -> int:
    """The exact uplink bits of ``message`` (shapes): each compressed tensor's encoding, the
    other tensors at their own width."""
    bits = 0
    for leaf in jax.tree.leaves(message):
        width = jnp.dtype(leaf.dtype).itemsize * 8
        bits += codec.bits(leaf.size, width) if compressed(leaf) else leaf.size * width
    return bits


def encode_message(codec: Compressor, message, key, shared_key, residual=None, weight=None):
    """(C applied to each compressed tensor of ``message`` (plus weight * its residual), the new
    residuals per unit weight)."""
    leaves, treedef = jax.tree.flatten(message)
    sent, kept = [], []
    for i, leaf in enumerate(leaves):
        if not compressed(leaf):
            sent.append(leaf)
            continue
        x = leaf
        if residual is not None:
            old = residual[len(kept)]
            x = (leaf + weight * old).astype(leaf.dtype)
        c = codec.encode(x.reshape(-1), jax.random.fold_in(key, i),
                         jax.random.fold_in(shared_key, i)).reshape(leaf.shape)
        sent.append(c)
        if residual is not None:
            kept.append(jnp.where(weight > 0, (x - c) / jnp.where(weight > 0, weight, 1), old
                                  ).astype(leaf.dtype))
    return treedef.unflatten(sent), tuple(kept)


def compress(algorithm: Algorithm, compressor: str, *, ratio: StaticFloat | None = None,
             levels: int | None = None, bits: int | None = None,
             bucket_size: int | None = None, unbiased: bool = False,
             error_feedback: bool = False) -> Algorithm:
    """``algorithm`` with its uplink compressed by ``compressor`` (``fljax.compression.make``:
    'top_k' and 'random_k' take ``ratio`` (and ``unbiased``), 'qsgd' ``levels`` (and
    ``bucket_size``), 'rotated_uniform' ``bits``, 'scaled_sign' nothing), with error feedback
    if ``error_feedback`` (module docstring)."""
    codec = make(compressor, ratio=ratio, levels=levels, bits=bits, bucket_size=bucket_size,
                 unbiased=unbiased)
    if not isinstance(error_feedback, bool):
        raise FljaxError(f"error_feedback must be true or false, got {error_feedback!r}")
    # Over an algorithm that aggregates side by side (robust, byzantine) the messages are
    # unweighted: the residual is then kept per unit of the message itself (weight 1).
    unweighted = algorithm.aggregate is not None
    if algorithm.perturb is not None:
        raise FljaxError(f"compress cannot wrap {algorithm.name}: its server adds noise to the "
                         f"cohort's sum (dp); wrap dp around compress instead, so that clients "
                         f"clip what they send")

    def inner(ctx: ClientContext) -> ClientContext:
        if not error_feedback:
            return ctx
        return ctx._replace(client_state=ctx.client_state.inner)

    def client_init(params):
        state = algorithm.client_init(params)
        if not error_feedback:
            return state
        _, message = messages(algorithm, params)
        zeros = tuple(jnp.zeros(leaf.shape, leaf.dtype) for leaf in jax.tree.leaves(message)
                      if compressed(leaf))
        return FeedbackClientState(state, zeros)

    def client_end(ctx: ClientContext, start, end):
        state, message = algorithm.client_end(inner(ctx), start, end)
        if not error_feedback:
            sent, _ = encode_message(codec, message, ctx.message_key, ctx.shared_key)
            return state, sent
        sent, residual = encode_message(codec, message, ctx.message_key, ctx.shared_key,
                                        ctx.client_state.residual,
                                        jnp.ones_like(ctx.weight) if unweighted else ctx.weight)
        return FeedbackClientState(state, residual), sent

    def cohort_start(ctx: ClientContext):
        first = algorithm.cohort_start(inner(ctx))
        return encode_message(codec, first, jax.random.fold_in(ctx.message_key, FIRST),
                              jax.random.fold_in(ctx.shared_key, FIRST))[0]

    uplink = {}     # the encoded bits by the model's shapes: the message is traced once, not
                    # every round the host accounts for

    def message_bits(round_index: int, params) -> tuple[int, int]:
        key = (jax.tree.structure(params),
               tuple((a.shape, jnp.dtype(a.dtype).name) for a in jax.tree.leaves(params)))
        if key not in uplink:
            first, message = messages(algorithm, params)
            uplink[key] = encoded_bits(codec, first) + encoded_bits(codec, message)
        return algorithm.payload(round_index)[0] * param_bits(params), uplink[key]

    observe = algorithm.observe
    if observe is not None and error_feedback:
        def observe(view):
            return algorithm.observe(view._replace(client_states=view.client_states.inner))

    personal_model = None
    if algorithm.personal_model is not None:
        personal_model = (algorithm.personal_model if not error_feedback else
                          lambda params, server_state, state: algorithm.personal_model(
                              params, server_state, state.inner))

    return algorithm._replace(
        name=f"{algorithm.name}+{codec.name}{'+ef' if error_feedback else ''}",
        client_init=client_init,
        client_start=lambda ctx, key: algorithm.client_start(inner(ctx), key),
        client_tx=lambda ctx: algorithm.client_tx(inner(ctx)),
        client_loss=lambda ctx, loss_fn: algorithm.client_loss(inner(ctx), loss_fn),
        client_end=client_end,
        cohort_start=None if algorithm.cohort_start is None else cohort_start,
        client_metrics=lambda ctx, start, end: algorithm.client_metrics(inner(ctx), start, end),
        client_vectors=lambda ctx: algorithm.client_vectors(inner(ctx)),
        observe=observe, personal_model=personal_model, message_bits=message_bits,
        rebase=None)
