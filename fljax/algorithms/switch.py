"""Switching algorithms at a round: FedDyn pre-training, then FedAvg.

Anonymous, "Rethinking Regularization in Federated Learning: An Initialization Perspective" (2024;
"FedDyn as initialization"), Algorithm 1: run FedDyn for the first T_switch rounds, then continue
from its global model with FedAvg. ``switch(first, then, at_round)`` does this for any two
algorithms:

    round t < T_switch:  every hook of ``first``;   t >= T_switch:  every hook of ``then``.

T_switch is either fixed (``at_round``) or found during the run (``when``): a criterion probe
(``fljax.probes.switching_criterion``, Proposition 1) that the switch evaluates after each round of
``first`` on ``first``'s own view of the round; the round after its ``switch_condition`` first
holds runs ``then`` (T_switch is kept in the server state, so a resumed run switches where the
uninterrupted one did). The criterion's metrics are logged every round (0 once switched) with
``switched`` (1.0 from the round that switched on).

State across the switch. By default both algorithms keep their own server and client state side by
side (``then``'s state starts from its ``server_init``/``client_init`` of the initial model); the
global model passes from one to the other unchanged. With ``carry_state=True`` the two algorithms
share ONE server state and ONE per-client state: ``then`` starts from the state ``first`` left
(every client's state, sampled or not, and the server's), as a run that changes only its update
rule at T_switch would. This needs states of the same structure (the same pytree, shapes and
dtypes of ``server_init`` and ``client_init``), checked when the state is built. It is what
FedDyn as initialization (Anonymous, 2024) Figure 12 runs: FedDyn -> FedDyn w/o h or w/o Reg
("fine-tuning with modified FedDyn"), where the variant continues from FedDyn's h_k and the server's
H = mean_k h_k (every ``feddyn`` variant keeps the same state for this); without it the variant
would restart from h_k = 0. Compilation: both algorithms are traced into the ONE round program and
each hook picks its branch with ``lax.cond`` on the round number, which is the same for every
client, so only the taken branch runs and nothing is recompiled at the switch.

Communication accounting (``exchanges``, ``payload``) follows the round for a fixed switch; with
``when`` it is ``first``'s throughout (the round of the switch is not known on the host).

``at_round`` may be a scalar integer array, traced too (an int32 tracer: each of R runs in one
program switches at its own round); the hooks of the round compare it on the device. What runs on
the host (``exchanges``, ``payload``, ``eval_models``) needs a concrete one.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from fljax.algorithms.base import Algorithm, ClientContext
from fljax.errors import FljaxError
from fljax.hyperparams import check, shown

NEVER = jnp.iinfo(jnp.int32).max   # the switch round before the criterion holds


def _zeros_like_output(fn, *args):
    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(lambda: fn(*args)))


def switch(first: Algorithm, then: Algorithm, at_round: int | None = None, *,
           when=None, carry_state: bool = False) -> Algorithm:
    """``first`` until round ``at_round`` (or until the criterion probe ``when`` holds), then
    ``then``; ``carry_state=True``: ``then`` continues from ``first``'s server and client state
    (states of the same structure)."""
    if (at_round is None) == (when is None):
        raise FljaxError("switch needs exactly one of at_round (a round) and when (a criterion "
                         f"probe), got at_round={at_round!r}, when={when!r}")
    if at_round is not None:
        check("at_round", at_round, lambda v: isinstance(v, int) and v >= 0, "an integer >= 0")
    if when is not None and when.server is None:
        raise FljaxError(f"switch: the criterion {when.name!r} has no server part to decide with")

    def switch_round(server_state):
        """T_switch: the first round that runs ``then``."""
        return at_round if when is None else server_state[1]["switch_round"]

    def use_first(round_index, server_state):
        return round_index < switch_round(server_state)

    def check_carry(kind, init1, init2, params):
        """With carry_state, the two states must be the same pytree of the same shapes/dtypes."""
        shape1, shape2 = jax.eval_shape(init1, params), jax.eval_shape(init2, params)
        if jax.tree.structure(shape1) != jax.tree.structure(shape2) or any(
                (a.shape, a.dtype) != (b.shape, b.dtype)
                for a, b in zip(jax.tree.leaves(shape1), jax.tree.leaves(shape2))):
            raise FljaxError(f"switch(carry_state=True) needs {first.name!r} and {then.name!r} "
                             f"to have the same {kind} state; they differ: "
                             f"{jax.tree.structure(shape1)} vs {jax.tree.structure(shape2)}")

    def server_init(params):
        if carry_state:
            check_carry("server", first.server_init, then.server_init, params)
        second = {"state": () if carry_state else then.server_init(params),
                  "rounds_done": jnp.zeros((), jnp.int32)}
        if when is not None:
            second.update(switch_round=jnp.asarray(NEVER, jnp.int32),
                          criterion=when.init(params, 0)[0])
        return {"state": first.server_init(params)}, second

    def client_init(params):
        if carry_state:
            check_carry("client", first.client_init, then.client_init, params)
            return first.client_init(params), ()
        return first.client_init(params), then.client_init(params)

    def contexts(ctx: ClientContext) -> tuple[ClientContext, ClientContext]:
        (s1, s2), (c1, c2) = ctx.server_state, ctx.client_state
        if carry_state:     # one shared state, kept in first's slots
            s2, c2 = {**s2, "state": s1["state"]}, c1
        m1, m2 = ctx.cohort_message or ((), ())
        o1, o2 = ctx.own_message or ((), ())
        return (ctx._replace(server_state=s1["state"], client_state=c1, cohort_message=m1,
                             own_message=o1),
                ctx._replace(server_state=s2["state"], client_state=c2, cohort_message=m2,
                             own_message=o2))

    def both(fn1, fn2, ctx, *args):
        """(fn1's output, zeros like fn2's) before the switch, (zeros, fn2's) from it on."""
        ctx1, ctx2 = contexts(ctx)
        return jax.lax.cond(use_first(ctx.round, ctx.server_state),
                            lambda: (fn1(ctx1, *args), _zeros_like_output(fn2, ctx2, *args)),
                            lambda: (_zeros_like_output(fn1, ctx1, *args), fn2(ctx2, *args)))

    def by_round(ctx, values1: dict, values2: dict) -> dict:
        """Each name of either dict; where both have it, the running algorithm's."""
        merged = dict(values1)
        for name, value in values2.items():
            merged[name] = jnp.where(use_first(ctx.round, ctx.server_state), values1[name],
                                     value) if name in values1 else value
        return merged

    def cohort_start(ctx):
        no_exchange = lambda c: ()
        return both(first.cohort_start or no_exchange, then.cohort_start or no_exchange, ctx)

    def client_start(ctx, key):
        ctx1, ctx2 = contexts(ctx)
        return jax.lax.cond(use_first(ctx.round, ctx.server_state),
                            lambda: first.client_start(ctx1, key),
                            lambda: then.client_start(ctx2, key))

    def client_metrics(ctx, start, end):
        """Each name of either algorithm; 0 for the algorithm not running this round."""
        return by_round(ctx, *both(first.client_metrics, then.client_metrics, ctx, start, end))

    def client_vectors(ctx):
        """Each algorithm's vectors of its own state (the one not running keeps its last)."""
        ctx1, ctx2 = contexts(ctx)
        return by_round(ctx, first.client_vectors(ctx1), then.client_vectors(ctx2))

    def client_tx(ctx):
        ctx1, ctx2 = contexts(ctx)
        tx1, tx2 = first.client_tx(ctx1), then.client_tx(ctx2)

        def init(params):
            return tx1.init(params), tx2.init(params)

        def update(grads, state, params=None):
            s1, s2 = state

            def with_first():
                updates, new = tx1.update(grads, s1, params)
                return updates, (new, s2)

            def with_then():
                updates, new = tx2.update(grads, s2, params)
                return updates, (s1, new)

            return jax.lax.cond(use_first(ctx.round, ctx.server_state), with_first, with_then)

        return optax.GradientTransformation(init, update)

    def client_loss(ctx, loss_fn):
        ctx1, ctx2 = contexts(ctx)
        loss1, loss2 = first.client_loss(ctx1, loss_fn), then.client_loss(ctx2, loss_fn)
        return lambda *args: jax.lax.cond(use_first(ctx.round, ctx.server_state),
                                          lambda: loss1(*args), lambda: loss2(*args))

    def client_end(ctx, start, end):
        ctx1, ctx2 = contexts(ctx)
        c1, c2 = ctx.client_state

        def with_first():
            new, message = first.client_end(ctx1, start, end)
            return (new, c2), (message, _zeros_like_output(then.client_end, ctx2, start, end)[1])

        def with_then():
            new, message = then.client_end(ctx2, start, end)
            states = (new, c2) if carry_state else (c1, new)
            return states, (_zeros_like_output(first.client_end, ctx1, start, end)[1], message)

        return jax.lax.cond(use_first(ctx.round, ctx.server_state), with_first, with_then)

    def server_update(params, server_state, message, round_index):
        (s1, s2), (m1, m2) = server_state, message

        def with_first():
            new_params, new = first.server_update(params, s1["state"], m1, round_index)
            return new_params, {"state": new}, s2["state"]

        def with_then():
            if carry_state:     # the shared state stays in first's slot
                new_params, new = then.server_update(params, s1["state"], m2, round_index)
                return new_params, {"state": new}, s2["state"]
            new_params, new = then.server_update(params, s2["state"], m2, round_index)
            return new_params, s1, new

        new_params, new1, new2 = jax.lax.cond(use_first(round_index, server_state), with_first,
                                              with_then)
        return new_params, (new1, {**s2, "state": new2, "rounds_done": round_index + 1})

    def observe(view):
        """The criterion on ``first``'s view of the round while ``first`` runs."""
        (s1, s2) = view.server_state
        first_view = view._replace(server_state=s1["state"], client_states=view.client_states[0],
                                   algorithm=first, state=s2["criterion"])
        running = use_first(view.round, view.server_state)
        measured = lambda: when.server(first_view)
        criterion, metrics = jax.lax.cond(
            running, measured, lambda: (s2["criterion"], _zeros_like_output(measured)[1]))
        holds = running & (metrics["switch_condition"] > 0)
        new_round = jnp.where(holds, view.round + 1, s2["switch_round"]).astype(jnp.int32)
        metrics = {**metrics, "switched": (view.round + 1 >= new_round).astype(
            metrics["switch_condition"].dtype)}
        return (s1, {**s2, "criterion": criterion, "switch_round": new_round}), metrics

    def eval_models(params, server_state):
        """The evaluation models of whichever algorithm made the last update (outside jit)."""
        (s1, s2) = server_state
        if int(s2["rounds_done"]) <= int(switch_round(server_state)):
            return first.eval_models(params, s1["state"])
        return then.eval_models(params, s1["state"] if carry_state else s2["state"])

    if when is None:
        name = f"{first.name}->{then.name}@{shown(at_round)}"
        exchanges = lambda t: first.exchanges(t) if t < at_round else then.exchanges(t)
        payload = lambda t: first.payload(t) if t < at_round else then.payload(t)
    else:
        name = f"{first.name}->{then.name}@{when.name}"
        exchanges, payload = first.exchanges, first.payload
    if first.perturb is not None or then.perturb is not None:
        raise FljaxError(f"switch cannot pass on the server noise of {first.name!r} or "
                         f"{then.name!r}: wrap the switch instead (dp(switch(a, b), ...))")
    if first.aggregate is not None or then.aggregate is not None:
        raise FljaxError(f"switch cannot pass on the cohort aggregation of {first.name!r} or "
                         f"{then.name!r}: wrap the switch instead (robust(switch(a, b), ...))")
    if first.observe is not None or then.observe is not None:
        raise FljaxError(f"switch cannot yet pass on the observe hook of {first.name!r} or "
                         f"{then.name!r}")
    return Algorithm(name=name, server_init=server_init, client_init=client_init,
                     client_start=client_start, client_tx=client_tx, client_loss=client_loss,
                     client_end=client_end, server_update=server_update,
                     eval_models=eval_models,
                     cohort_start=(cohort_start if first.cohort_start or then.cohort_start
                                   else None),
                     client_metrics=client_metrics, client_vectors=client_vectors,
                     exchanges=exchanges, payload=payload,
                     observe=observe if when is not None else None)
