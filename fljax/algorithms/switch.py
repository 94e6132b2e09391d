"""Switching algorithms at a round: FedDyn pre-training, then FedAvg.

Kim et al., "FedDyn as initialization" (feddyn-as-initialization.txt), Algorithm 1: run FedDyn for
the first T_switch rounds, then continue from its global model with FedAvg. ``switch(first, then,
at_round)`` does this for any two algorithms:

    round t < at_round:  every hook of ``first``;   t >= at_round:  every hook of ``then``.

Both algorithms keep their own server and client state side by side (``then``'s state starts from
its ``server_init``/``client_init`` of the initial model); the global model passes from one to the
other unchanged. Compilation: both algorithms are traced into the ONE round program and each hook
picks its branch with ``lax.cond`` on the round number, which is the same for every client, so only
the taken branch runs and nothing is recompiled at the switch.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from fljax.algorithms.base import Algorithm, ClientContext
from fljax.errors import FljaxError


def _zeros_like_output(fn, *args):
    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(lambda: fn(*args)))


def switch(first: Algorithm, then: Algorithm, at_round: int) -> Algorithm:
    """``first`` for rounds 0..at_round-1, ``then`` from round ``at_round`` on."""
    if not isinstance(at_round, int) or at_round < 0:
        raise FljaxError(f"at_round must be an integer >= 0, got {at_round!r}")

    def use_first(round_index):
        return round_index < at_round

    def server_init(params):
        return ({"state": first.server_init(params)},
                {"state": then.server_init(params), "rounds_done": jnp.zeros((), jnp.int32)})

    def client_init(params):
        return first.client_init(params), then.client_init(params)

    def contexts(ctx: ClientContext) -> tuple[ClientContext, ClientContext]:
        (s1, s2), (c1, c2) = ctx.server_state, ctx.client_state
        m1, m2 = ctx.cohort_message or ((), ())
        o1, o2 = ctx.own_message or ((), ())
        return (ctx._replace(server_state=s1["state"], client_state=c1, cohort_message=m1,
                             own_message=o1),
                ctx._replace(server_state=s2["state"], client_state=c2, cohort_message=m2,
                             own_message=o2))

    def both(fn1, fn2, ctx1, ctx2, *args):
        """(fn1's output, zeros like fn2's) before the switch, (zeros, fn2's) from it on."""
        return jax.lax.cond(use_first(ctx1.round),
                            lambda: (fn1(ctx1, *args), _zeros_like_output(fn2, ctx2, *args)),
                            lambda: (_zeros_like_output(fn1, ctx1, *args), fn2(ctx2, *args)))

    def cohort_start(ctx):
        ctx1, ctx2 = contexts(ctx)
        no_exchange = lambda c: ()
        return both(first.cohort_start or no_exchange, then.cohort_start or no_exchange,
                    ctx1, ctx2)

    def client_start(ctx, key):
        ctx1, ctx2 = contexts(ctx)
        return jax.lax.cond(use_first(ctx.round), lambda: first.client_start(ctx1, key),
                            lambda: then.client_start(ctx2, key))

    def client_metrics(ctx, start, end):
        """Each name of either algorithm; 0 for the algorithm not running this round."""
        ctx1, ctx2 = contexts(ctx)
        m1, m2 = both(first.client_metrics, then.client_metrics, ctx1, ctx2, start, end)
        merged = dict(m1)
        for name, value in m2.items():
            merged[name] = jnp.where(use_first(ctx.round), m1[name], value) if name in m1 else value
        return merged

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

            return jax.lax.cond(use_first(ctx.round), with_first, with_then)

        return optax.GradientTransformation(init, update)

    def client_loss(ctx, loss_fn):
        ctx1, ctx2 = contexts(ctx)
        loss1, loss2 = first.client_loss(ctx1, loss_fn), then.client_loss(ctx2, loss_fn)
        return lambda *args: jax.lax.cond(use_first(ctx.round), lambda: loss1(*args),
                                          lambda: loss2(*args))

    def client_end(ctx, start, end):
        ctx1, ctx2 = contexts(ctx)
        c1, c2 = ctx.client_state

        def with_first():
            new, message = first.client_end(ctx1, start, end)
            return (new, c2), (message, _zeros_like_output(then.client_end, ctx2, start, end)[1])

        def with_then():
            new, message = then.client_end(ctx2, start, end)
            return (c1, new), (_zeros_like_output(first.client_end, ctx1, start, end)[1], message)

        return jax.lax.cond(use_first(ctx.round), with_first, with_then)

    def server_update(params, server_state, message, round_index):
        (s1, s2), (m1, m2) = server_state, message

        def with_first():
            new_params, new = first.server_update(params, s1["state"], m1, round_index)
            return new_params, {"state": new}, s2["state"]

        def with_then():
            new_params, new = then.server_update(params, s2["state"], m2, round_index)
            return new_params, s1, new

        new_params, new1, new2 = jax.lax.cond(use_first(round_index), with_first, with_then)
        return new_params, (new1, {"state": new2, "rounds_done": round_index + 1})

    def eval_models(params, server_state):
        """The evaluation models of whichever algorithm made the last update (outside jit)."""
        (s1, s2) = server_state
        if int(s2["rounds_done"]) <= at_round:
            return first.eval_models(params, s1["state"])
        return then.eval_models(params, s2["state"])

    return Algorithm(name=f"{first.name}->{then.name}@{at_round}", server_init=server_init,
                     client_init=client_init, client_start=client_start, client_tx=client_tx,
                     client_loss=client_loss, client_end=client_end, server_update=server_update,
                     eval_models=eval_models,
                     cohort_start=(cohort_start if first.cohort_start or then.cohort_start
                                   else None),
                     client_metrics=client_metrics,
                     exchanges=lambda t: first.exchanges(t) if t < at_round else then.exchanges(t))
