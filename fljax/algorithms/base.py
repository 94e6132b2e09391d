"""The algorithm interface: a NamedTuple of pure functions, built by a factory (optax style).

A communication round, as the engine runs it for every sampled client i (all inside one jit):

    [c_i           = cohort_start(ctx); C = sum_i c_i]       # optional first exchange (FedGA's
                                                             #   full gradients), C and c_i in ctx
    ctx            = ClientContext(global params w, server state, client state s_i, round, ...)
    y_i,0          = client_start(ctx, key)                  # FedInit relaxed init, FedGA
    tx             = client_tx(ctx)                          # local optax chain: corrections,
                                                             #   masks, schedules, SAM
    loss           = client_loss(ctx, model_loss)            # feature-level regularizers
    y_i,K          = K steps of tx on grad(loss)
    s_i', m_i      = client_end(ctx, y_i,0, y_i,K)
    M              = sum_i m_i                               # a psum across devices
    w', server'    = server_update(w, server state, M, round)
    models         = eval_models(w', server')                # what evaluation reports; "global"
                                                             #   first (FedExP's two-iterate mean)
    client_metrics(ctx, y_i,0, y_i,K)                        # per-client scalars; the round
                                                             #   reports their cohort mean
    client_vectors(ctx)                                      # named views of a client's state
                                                             #   for probes (FedDyn's drift)
    payload(t)                                               # (down, up) model copies per
                                                             #   client, for byte accounting

Messages are SUMMED over the cohort, so a client scales its own message: ``ctx.weight`` is its
aggregation weight p_i (example-count or uniform, summing to 1 over the cohort), and
``ctx.cohort_size`` lets an algorithm take an unweighted mean instead. Per-client state lives in the
engine's state stacked over all clients; a stateless algorithm uses ``()``.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import optax

from fljax.algorithms.transforms import zero_frozen
from fljax.fielddocs import document_fields
from fljax.hyperparams import NON_NEGATIVE, POSITIVE, check, is_value

Params = Any
LossFn = Callable[..., jax.Array]  # loss_fn(params, x, y, mask, rng) -> scalar


class ClientContext(NamedTuple):
    """What a sampled client knows during a round (all leaves are traced arrays)."""

    params: Params
    server_state: Any
    client_state: Any
    round: jax.Array
    client_id: jax.Array
    weight: jax.Array
    cohort_size: int
    num_clients: int
    num_examples: jax.Array
    mean_examples: jax.Array
    num_steps: jax.Array
    max_steps: int
    steps_per_epoch: jax.Array
    full_gradient: Callable[[Params], Params]
    cohort_message: Any = ()
    own_message: Any = ()
    train: Callable[..., Params] | None = None
    message_key: jax.Array | None = None
    shared_key: jax.Array | None = None


document_fields(ClientContext, {
    "params": "the broadcast global model w^t",
    "server_state": "the server's state (e.g. SCAFFOLD's c), read-only for clients",
    "client_state": "this client's own state s_i (``()`` when stateless)",
    "round": "shape=(), int32: the round t",
    "client_id": "shape=(), int32: the client i",
    "weight": "shape=(), float: the aggregation weight p_i, summing to 1 over the cohort",
    "cohort_size": "|S^t|, the number of clients this round (static; a traced int under "
                   "Bernoulli participation)",
    "num_clients": "N, all clients (static)",
    "num_examples": "shape=(), int32: n_i, this client's training examples",
    "mean_examples": "shape=(), float: the mean of n_j over all N clients (FedDyn's weights)",
    "num_steps": "shape=(), int32: the local steps client i takes this round",
    "max_steps": "the most local steps any client takes (static): num_steps <= it",
    "steps_per_epoch": "shape=(), int32: ceil(n_i / batch size)",
    "full_gradient": "full_gradient(params) -> the gradient of the mean model loss over all n_i "
                     "examples (traced only if an algorithm calls it)",
    "cohort_message": "the sum over the cohort of cohort_start's messages (if it has one)",
    "own_message": "this client's own cohort_start message (kept, not sent again)",
    "train": "train(tx, start, stream, loss=None) -> the client's model after its num_steps "
             "steps of ``tx`` from ``start`` on ``loss`` (default: the model's loss): the round's "
             "local loop run again, on batches of an independent draw numbered ``stream`` >= 1 "
             "(Ditto's personal model); set by the engine",
    "message_key": "this client's key for randomness in its message (a compressor's rounding), "
                   "set by the engine",
    "shared_key": "the round's key shared by every client (public randomness: a compressor's "
                  "rotation)",
})


class Algorithm(NamedTuple):
    """A federated algorithm: pure functions the engine calls inside the compiled round.

    Build one with a factory (``fljax.fedavg(...)``) and change what differs with ``_replace``;
    never subclass. Every function is traced once into the round program, so it must be pure
    and use jax.numpy. For each sampled client i of round t the engine calls, in order:

    - ``client_start(ctx, key) -> y_i,0``: the local start (usually ``ctx.params``, w^t);
    - ``client_tx(ctx) -> optax.GradientTransformation``: the local optimizer for this round;
    - ``client_loss(ctx, loss_fn) -> loss_fn``: the local objective (``loss_fn(params, x, y,
      mask, rng)`` is the model's masked mean cross-entropy);
    - K steps of ``client_tx`` on ``grad(client_loss)`` from y_i,0 give y_i,K;
    - ``client_end(ctx, y_i,0, y_i,K) -> (new client state, message)``: the message is SUMMED
      over the cohort, so scale it by ``ctx.weight`` (p_i, summing to 1) for a weighted mean;
    - ``client_metrics(ctx, y_i,0, y_i,K) -> {name: scalar}``: logged as the cohort mean.

    Then, once per round: ``server_update(w^t, server state, summed message, t) -> (w^{t+1},
    server state)``. State: ``server_init(params)`` and ``client_init(params)`` give the initial
    server and per-client state (``()`` when there is none; the engine stacks the client state
    over all clients and gives a sampled client its own row as ``ctx.client_state``). Optional:
    ``cohort_start`` (a first exchange, FedGA), ``eval_models`` (what evaluation scores),
    ``exchanges`` and ``payload`` (communication accounting), ``client_vectors`` (per-client
    vectors for probes), ``observe`` (a look at the whole round after the server update),
    ``perturb`` (randomness the server adds to the summed message before ``server_update``),
    ``message_bits`` (the exact bits of an encoded message, when not ``payload``'s copies).
    ``personal_model(params, server_state, client_state) -> params``: a client's own model, for
    algorithms with personal models (Ditto, pFedMe, FedEM's mixture weights, FedBN's local
    layers); the personalized evaluation scores each user with it (None: the global model),
    after ``adapt(model, gradient)`` if set (FedEM: an E-step on the user's training split).
    ``ClientContext`` lists what a client knows.

    FedAvg with the server's update clipped to norm 1::

        base = fljax.fedavg(fljax.local_sgd(0.05))
        clip = optax.clip_by_global_norm(1.0)

        def server_update(params, server_state, delta, round_index):
            delta, _ = clip.update(delta, clip.init(delta))
            return base.server_update(params, server_state, delta, round_index)

        clipped = base._replace(name="fedavg_clip", server_update=server_update)

    ``notebooks/new_algorithm.ipynb`` writes one from scratch and checks it against FedAvg.
    """

    name: str
    server_init: Callable[[Params], Any]
    client_init: Callable[[Params], Any]
    client_start: Callable[[ClientContext, jax.Array], Params]
    client_tx: Callable[[ClientContext], optax.GradientTransformation]
    client_loss: Callable[[ClientContext, LossFn], LossFn]
    client_end: Callable[[ClientContext, Params, Params], tuple[Any, Any]]
    server_update: Callable[[Params, Any, Any, jax.Array], tuple[Params, Any]]
    eval_models: Callable[[Params, Any], dict[str, Params]] = (
        lambda params, server_state: {"global": params})
    cohort_start: Callable[[ClientContext], Any] | None = None
    client_metrics: Callable[[ClientContext, Params, Params], dict[str, jax.Array]] = (
        lambda ctx, start, end: {})
    exchanges: Callable[[int], int] = lambda round_index: 1
    payload: Callable[[int], tuple[int, int]] = lambda round_index: (1, 1)
    client_vectors: Callable[[ClientContext], dict[str, Params]] = lambda ctx: {}
    observe: Callable[[Any], tuple[Any, dict[str, jax.Array]]] | None = None
    personal_model: Callable[[Params, Any, Any], Params] | None = None
    adapt: Callable[[Params, Callable[[Params], Params]], Params] | None = None
    perturb: Callable[[Any, Any, jax.Array], Any] | None = None
    message_bits: Callable[[int, Params], tuple[int, int]] | None = None
    aggregate: Callable[["CohortMessages"], tuple[Any, dict[str, jax.Array]]] | None = None
    rebase: Callable[[ClientContext, Any, Params], Any] | None = None


class CohortMessages(NamedTuple):
    """The cohort's messages side by side, for ``Algorithm.aggregate``: one row per slot of the
    round, in slot order. Memory: m rows of a message (m = the cohort's slots; under Bernoulli
    participation every client has a slot), gathered onto every device."""

    messages: Any           # each client's message stacked on a leading [m] axis (as sent)
    weights: jax.Array      # [m] float: p_i, summing to 1 over the slots that joined
    joined: jax.Array       # [m] bool: the slot's client took part (False: an empty Bernoulli
                            #   slot, whose message is zeros)
    ids: jax.Array          # [m] int32: the slot's client id
    num_clients: int        # N, all clients (static)
    server_state: Any       # the server's state before this round's update
    round: jax.Array        # t
    key: jax.Array          # this round's key for aggregation randomness (bucketing, attacks)


document_fields(CohortMessages, {
    "messages": "each slot's message stacked on a leading [m] axis, as ``client_end`` sent it",
    "weights": "[m] p_i, summing to 1 over the slots that joined (0 for an empty slot)",
    "joined": "[m] whether the slot's client took part; an empty Bernoulli slot's message is "
              "zeros and must be ignored",
    "ids": "[m] the slot's client id",
    "num_clients": "N, all clients (static)",
    "server_state": "the server's state before this round's update",
    "round": "t, the round",
    "key": "this round's key for randomness in the aggregation (bucketing, simulated attacks), "
           "independent of the clients' keys and of ``perturb``'s",
})


document_fields(Algorithm, {
    "name": "the algorithm's name, as logs and tables show it",
    "server_init": "server_init(params) -> the server's initial state (``()``: none)",
    "client_init": "client_init(params) -> one client's initial state (``()``: none); the engine "
                   "stacks it over all clients",
    "client_start": "client_start(ctx, key) -> y_i,0, the local start (usually ``ctx.params``, "
                    "w^t)",
    "client_tx": "client_tx(ctx) -> the local optax optimizer of this round",
    "client_loss": "client_loss(ctx, loss_fn) -> the local objective (``loss_fn(params, x, y, "
                   "mask, rng)``: the model's masked mean cross-entropy)",
    "client_end": "client_end(ctx, y_i,0, y_i,K) -> (new client state, message); messages are "
                  "SUMMED over the cohort, so scale by ``ctx.weight`` for a weighted mean",
    "server_update": "server_update(w^t, server state, summed message, t) -> (w^{t+1}, server "
                     "state)",
    "eval_models": "eval_models(w, server state) -> {name: params}: what evaluation scores, "
                   "'global' first (FedExP: the mean of the last two iterates)",
    "cohort_start": "cohort_start(ctx) -> a message of a first exchange, summed over the cohort "
                    "into ``ctx.cohort_message`` (FedGA's full gradients); None: no first "
                    "exchange",
    "client_metrics": "client_metrics(ctx, y_i,0, y_i,K) -> {name: scalar}, logged as the "
                      "cohort mean",
    "exchanges": "exchanges(t) -> the server<->client exchanges of round t (FedGA: 2)",
    "payload": "payload(t) -> (down, up): the model-sized vectors a participating client "
               "receives and sends in round t, for communication accounting (SCAFFOLD: model "
               "and control variate both ways)",
    "client_vectors": "client_vectors(ctx) -> named per-client vectors derived from "
                      "ctx.client_state, for probes (FedDyn: the local drift -alpha_k h_k; "
                      "SCAFFOLD: the control variate c_i)",
    "observe": "observe(view) -> (server state, metrics), after the server update: sees the "
               "whole round and population (a fljax.probes.RoundView); the adaptive switch "
               "decides here; None: nothing",
    "personal_model": "personal_model(w, server state, s_i) -> client i's own model (None: "
                      "everyone uses w)",
    "adapt": "adapt(a user's model, grad of its mean training loss at given params) -> the model "
             "it is scored with (before any fine-tuning): FedEM's E-step fits the user's "
             "mixture weights; None: none",
    "perturb": "perturb(summed message, server state, key) -> the message server_update "
               "receives: the server's own randomness on the cohort's sum (DP's Gaussian "
               "noise), from the round's server key (``fljax.population.cohort.server_key``); None: none",
    "aggregate": "aggregate(CohortMessages) -> (message, {name: scalar}): the cohort's messages "
                 "side by side (unweighted rows, their p_i and a mask), reduced by the "
                 "algorithm itself (a median, Krum, an attack's simulation) into the message "
                 "``server_update`` receives; the metrics join the round's. Memory: m messages. "
                 "None (default): messages are summed and the round is the same program as "
                 "without this hook",
    "rebase": "rebase(ctx, message, shift) -> the message ``client_end`` would send had its "
              "model update been measured from ctx.params + shift instead of ctx.params, the "
              "client's own state unchanged (FedDyn: p_i (y - r) -> p_i (y - r - shift)); "
              "relaxed_init's aggregate 'mixed' uses it. A wrapper that changes the message "
              "sets it to None. None: not declared",
    "message_bits": "message_bits(t, params) -> (bits down, bits up) a participating client "
                    "receives and sends in round t, for a model shaped like ``params`` (shapes "
                    "suffice): a compressed uplink's exact encoding "
                    "(``fljax.algorithms.compress``); None: ``payload``'s model copies",
})


def with_inner_server_state(algorithm: Algorithm, **changes) -> Algorithm:
    """``algorithm`` for a wrapper whose server state holds the algorithm's own as ``.inner``
    (a NamedTuple with an ``inner`` field): every function that reads the server state is given
    ``.inner``; ``changes`` (the wrapper's own functions, which see the whole state) replace
    fields after that."""
    def view(ctx: ClientContext) -> ClientContext:
        return ctx._replace(server_state=ctx.server_state.inner)

    lifted = dict(
        client_start=lambda ctx, key: algorithm.client_start(view(ctx), key),
        client_tx=lambda ctx: algorithm.client_tx(view(ctx)),
        client_loss=lambda ctx, loss_fn: algorithm.client_loss(view(ctx), loss_fn),
        client_end=lambda ctx, start, end: algorithm.client_end(view(ctx), start, end),
        client_metrics=lambda ctx, start, end: algorithm.client_metrics(view(ctx), start, end),
        client_vectors=lambda ctx: algorithm.client_vectors(view(ctx)),
        eval_models=lambda params, server_state: algorithm.eval_models(params,
                                                                       server_state.inner))
    if algorithm.observe is not None:
        def observe(round_view):
            inner, metrics = algorithm.observe(round_view._replace(
                server_state=round_view.server_state.inner))
            return round_view.server_state._replace(inner=inner), metrics
        lifted["observe"] = observe
    if algorithm.personal_model is not None:
        lifted["personal_model"] = lambda params, server_state, client_state: (
            algorithm.personal_model(params, server_state.inner, client_state))
    return algorithm._replace(**{**lifted, **changes})


class LocalSGD(NamedTuple):
    """The local optimizer of the reference code: torch SGD after ``clip_grad_norm_``.

    Per step, for the loss gradient g at the local model y:
        g <- g + sum(loss_terms)           gradients of terms that sit in the loss (clipped)
        g <- 0 on frozen leaves            (only when update() is given ``frozen=``: FedBug)
        g <- clip(g, clip_norm)
        g <- g + (weight_decay + extra_weight_decay) * y        (torch's weight_decay: unclipped)
        buf <- momentum * buf + g; y <- y - lr_t * buf                 (torch-style momentum)

    with the learning rate of round t

        lr_t = learning_rate * round_decay**t                       (inverse_decay_offset=None)
        lr_t = learning_rate * round_decay**t * d / (t + d)         (inverse_decay_offset=d > 0)

    The second, with round_decay = 1, is the round schedule of FedDecay's Theorems 1-2
    (FedDecay (Anonymous, 2023)): alpha_t = c / (t + d) with c = learning_rate * d (lr_0 =
    learning_rate), so that under ``feddecay``'s within-round decay local step k of round t takes
    c / (t + d) * beta_k.

    Every number may be a scalar array, traced too (``fljax.hyperparams``); ``clip_norm=None`` (no
    clip) and ``inverse_decay_offset=None`` (no inverse-time decay) are structural. A concrete
    momentum or weight decay of 0 leaves out the buffer or the decay term; a traced one keeps them
    (momentum 0 then gives buf = g, the same steps).
    """

    learning_rate: float
    round_decay: float = 1.0
    momentum: float = 0.0
    weight_decay: float = 0.0
    clip_norm: float | None = None
    inverse_decay_offset: float | None = None

    def lr(self, round_index: jax.Array) -> jax.Array:
        """eta_l * decay**t, times d / (t + d) with an inverse-decay offset d."""
        lr = self.learning_rate * self.round_decay ** round_index
        if self.inverse_decay_offset is not None:
            d = self.inverse_decay_offset
            lr = lr * d / (round_index + d)        # (eta_l d) / (t + d) = c / (t + d)
        return lr

    def chain(self, round_index: jax.Array, loss_terms: Sequence[optax.GradientTransformation] = (),
              extra_weight_decay: jax.Array | float = 0.0) -> optax.GradientTransformation:
        parts = list(loss_terms)
        if parts and self.clip_norm is not None:
            parts.append(zero_frozen())
        if self.clip_norm is not None:
            parts.append(optax.clip_by_global_norm(self.clip_norm))
        decay = self.weight_decay + extra_weight_decay
        if not is_value(decay, 0.0):
            parts.append(optax.add_decayed_weights(decay))
        momentum = None if is_value(self.momentum, 0.0) else self.momentum
        parts.append(optax.sgd(self.lr(round_index), momentum=momentum))
        return optax.chain(*parts)


def local_sgd(learning_rate: float, *, round_decay: float = 1.0, momentum: float = 0.0,
              weight_decay: float = 0.0, clip_norm: float | None = None,
              inverse_decay_offset: float | None = None) -> LocalSGD:
    """LocalSGD with keyword arguments, each checked (a traced one where it was concrete)."""
    check("learning_rate", learning_rate, POSITIVE, "> 0 and finite")
    check("round_decay", round_decay, lambda v: 0 < v <= 1, "in (0, 1]")
    check("momentum", momentum, lambda v: 0 <= v < 1, "in [0, 1)")
    check("weight_decay", weight_decay, NON_NEGATIVE, ">= 0 and finite")
    if clip_norm is not None:
        check("clip_norm", clip_norm, POSITIVE, "> 0 and finite, or None")
    if inverse_decay_offset is not None:
        check("inverse_decay_offset", inverse_decay_offset, POSITIVE, "> 0 and finite, or None")
    return LocalSGD(learning_rate, round_decay, momentum, weight_decay, clip_norm,
                    inverse_decay_offset)


ClientOptimizer = Callable[[jax.Array], optax.GradientTransformation]


def as_client_optimizer(opt: LocalSGD | optax.GradientTransformation | ClientOptimizer
                        ) -> ClientOptimizer:
    """A function of the round from LocalSGD, a fixed optax transformation, or such a function."""
    if isinstance(opt, LocalSGD):
        return opt.chain
    if isinstance(opt, optax.GradientTransformation):
        return lambda round_index: opt
    return opt


def tree_scale(scalar: jax.Array, tree: Params) -> Params:
    """scalar * tree, keeping each leaf's dtype."""
    return jax.tree.map(lambda x: (scalar * x).astype(x.dtype), tree)


def tree_sub(a: Params, b: Params) -> Params:
    """a - b leafwise."""
    return jax.tree.map(jnp.subtract, a, b)


def identity_start(ctx: ClientContext, key: jax.Array) -> Params:
    """Start local training from the broadcast model: y_i,0 = w."""
    del key
    return ctx.params


def identity_loss(ctx: ClientContext, loss_fn: LossFn) -> LossFn:
    """Train on the model's loss unchanged."""
    del ctx
    return loss_fn


def no_client_state(params: Params) -> tuple:
    """Stateless clients."""
    del params
    return ()
