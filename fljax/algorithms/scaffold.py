"""SCAFFOLD: local steps corrected by control variates.

Karimireddy, Kale, Mohri, Reddi, Stich, Suresh, "SCAFFOLD: Stochastic Controlled Averaging for
Federated Learning", ICML 2020 (Algorithm 1).

The server keeps a control variate c, every client i its own c_i; all start at 0. In round t the
sampled clients start from x = w^t and take K_i local steps

    y <- y - eta_l [ clip( g_i(y) - c_i + c ) + wd * y ]         (eta_l = lr * decay^t)

(the correction c - c_i is the gradient of the linear loss term <y, c - c_i>, so it is clipped with
the loss gradient, as in the FedDyn and FL-Simulator code; weight decay is added after clipping).
Then the client's new control variate is

    Option I  (``option="I"``):   c_i+ = g_i(x)    the full gradient of its data at x (extra pass)
    Option II (``option="II"``):  c_i+ = c_i - c + (x - y_i,K) / (K_i eta_l)      (default)

and the server, with p_i the engine's aggregation weights (sum_S p_i = 1), sets

    x <- x + eta_g sum_{i in S} p_i (y_i,K - x)          (eta_g = ``server_lr``, default 1)
    c <- c + (1/N) sum_{i in S} (c_i+ - c_i)              (= c + |S|/N * mean_S (c_i+ - c_i))

Unsampled clients keep c_i. The paper's Delta x is an unweighted mean_S, as in the FedDyn and
FL-Simulator code: run the engine with aggregation='uniform' for it.

``option="GA"``: SCAFFOLD as the FedGA authors' code runs it (``epfml/GradientAlignment``
``interface.py:Scaffold``), the baseline of FedGA / GradAlign (Dandi, Barba and Jaggi, AAAI 2022)
Table 1 and Figure 2. No control variate is kept across rounds: each round takes two exchanges
(``exchanges`` = 2), as FedGA's does. In the first the sampled clients send their full local
gradients at the broadcast model, and the server returns their example-weighted mean over the cohort
(``compute_full_gradient``):

    c_i = g_i(x),        c = gbar(x) = sum_{i in S} n_i g_i(x) / sum_{i in S} n_i,

then every local step adds the fresh correction c - c_i to the minibatch gradient before clipping
(``param.grad += full_gradient - local_gradient``, then ``clip_grad_norm_``; torch's weight decay
after), and the server averages the final models, x <- x + eta_g sum_S p_i (y_i,K - x) (the code:
unweighted, aggregation='uniform', server SGD lr 1). It is option I with c_i and c recomputed at the
current x every round instead of carried over. Payload: x, then c down; g_i(x), then y_i,K up.
Not copied: that code steps its MultiStepLR scheduler twice per round for SCAFFOLD (once for FedGA),
so its lr milestones come twice as early; fljax's round decay is the same for every algorithm.

Option II's eta_l is by default the CURRENT (decayed) local lr, as in the paper and FL-Simulator;
``undecayed_lr=True`` uses the base lr even when the lr decays, as the FedDyn code does
(``train_SCAFFOLD``). K_i is the number of steps client i took.
Not copied: the FedDyn code's rescaling of c by the client weight n_i/mean(n) in the loss and in the
c update, FL-Simulator's K computed as a float from client 0's data size, and NIID-Bench's
correction applied outside the optimizer.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from fljax.registry import declare
from fljax.algorithms.base import (Algorithm, ClientContext, LocalSGD, identity_loss,
                                   identity_start, tree_scale, tree_sub)
from fljax.algorithms.fedga import gradient_exchange, gradient_mismatch
from fljax.algorithms.transforms import add_constant
from fljax.errors import FljaxError
from fljax.hyperparams import POSITIVE, check

OPTIONS = ("I", "II", "GA")


def _zeros(params):
    return jax.tree.map(jnp.zeros_like, params)


@declare(aggregation="uniform")   # the paper's / official code's unweighted mean
def scaffold(local: LocalSGD, *, server_lr: float = 1.0, option: str = "II",
             undecayed_lr: bool = False, name: str = "scaffold") -> Algorithm:
    """SCAFFOLD on the local optimizer ``local``; server state c, client state c_i."""
    if not isinstance(local, LocalSGD):
        raise FljaxError(f"scaffold needs a LocalSGD local optimizer (its correction is "
                         f"clipped with the loss gradient), got {type(local).__name__}")
    check("server_lr", server_lr, POSITIVE, "> 0 and finite")
    if option not in OPTIONS:
        raise FljaxError(f"option must be one of {OPTIONS}, got {option!r}")

    def client_tx(ctx: ClientContext) -> optax.GradientTransformation:
        if option == "GA":
            correction = gradient_mismatch(ctx)                               # gbar(x) - g_i(x)
        else:
            correction = tree_sub(ctx.server_state, ctx.client_state)        # c - c_i
        return local.chain(ctx.round, loss_terms=[add_constant(correction)])

    def new_control(ctx: ClientContext, end):
        if option == "I":
            return jax.tree.map(lambda g, x: g.astype(x.dtype),                 # g_i(x)
                                ctx.full_gradient(ctx.params), ctx.params)
        lr = local.learning_rate if undecayed_lr else local.lr(ctx.round)
        denominator = ctx.num_steps * lr                                      # K_i eta_l
        return jax.tree.map(lambda ci, c, x, y: (ci - c + (x - y) / denominator).astype(x.dtype),
                            ctx.client_state, ctx.server_state, ctx.params, end)

    def client_end(ctx: ClientContext, start, end):
        del start
        c_new = new_control(ctx, end)
        delta = tree_scale(ctx.weight, tree_sub(end, ctx.params))            # p_i (y_i - x)
        delta_c = tree_scale(1.0 / ctx.num_clients, tree_sub(c_new, ctx.client_state))
        return c_new, (delta, delta_c)

    def server_update(params, c, message, round_index):
        del round_index
        delta, delta_c = message
        params = jax.tree.map(lambda x, d: (x + server_lr * d).astype(x.dtype), params, delta)
        return params, jax.tree.map(jnp.add, c, delta_c)

    if option == "GA":
        def client_end_ga(ctx: ClientContext, start, end):
            del start
            return ctx.client_state, tree_scale(ctx.weight, tree_sub(end, ctx.params))

        def server_update_ga(params, state, delta, round_index):
            del round_index
            params = jax.tree.map(lambda x, d: (x + server_lr * d).astype(x.dtype), params, delta)
            return params, state

        no_state = lambda params: ()
        return Algorithm(name=name, server_init=no_state, client_init=no_state,
                         client_start=identity_start, client_tx=client_tx,
                         client_loss=identity_loss, client_end=client_end_ga,
                         server_update=server_update_ga, cohort_start=gradient_exchange,
                         exchanges=lambda round_index: 2,
                         payload=lambda round_index: (2, 2))  # x, c down; g_i(x), y_i,K up

    return Algorithm(name=name, server_init=_zeros, client_init=_zeros,
                     client_start=identity_start, client_tx=client_tx, client_loss=identity_loss,
                     client_end=client_end, server_update=server_update,
                     payload=lambda round_index: (2, 2),         # x and c down, y - x and c_i+ up
                     client_vectors=lambda ctx: {"control_variate": ctx.client_state})
