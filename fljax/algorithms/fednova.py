"""FedNova: federated normalized averaging.

Wang, Liu, Liang, Joshi, Poor, "Tackling the Objective Inconsistency Problem in Heterogeneous
Federated Optimization", NeurIPS 2020. Follows the official code, ``JYWa/FedNova``
``distoptim/FedNova.py``.

Client i takes tau_i local steps (``ctx.num_steps``: E_i * ceil(n_i/B) in epochs mode) of torch SGD
from y_i,0 = x with weight decay wd, momentum rho (the LocalSGD's) and an optional proximal term mu:

    d = g(y) + wd y;  buf <- rho buf + d  (d <- buf);  d <- d + mu (y - x);  y <- y - lr d,

and accumulates cum_grad_i = sum_k lr d_k = x - y_i,tau_i. In the official code ``d_p = buf``
aliases the momentum buffer, so the in-place ``d_p.add_(mu, p - old_init)`` also lands in the
buffer: the proximal gradient enters the momentum exactly as a loss term does, which is how it is
built here (``local.chain(loss_terms=[add_proximal(mu, x)])``; the official code does not clip;
with ``clip_norm`` set, the proximal term is clipped with the loss gradient as in FedProx). The
normalizer a_i follows the code's per-step recursion (counter_0 = a_0 = 0):

    rho != 0:   counter <- rho counter + 1;  a <- a + counter
                (a_i = sum_{k=1}^{tau_i} (1 - rho^k) / (1 - rho) without prox)
    mu != 0:    a <- a (1 - lr mu) + 1      (after the momentum line when both)
    otherwise:  a <- a + 1                  (a_i = tau_i)

with lr the round's local lr. Clients send p_i (x - y_i)/a_i, p_i a_i and p_i tau_i; the server sets

    tau_eff = sum_{i in S} p_i a_i     (sum_{i in S} p_i tau_i if mu != 0, as the code does)
    x      <- x - tau_eff sum_{i in S} p_i (x - y_i,tau_i) / a_i

(p_i = n_i / sum_S n_j, the engine's aggregation='examples'). With equal tau_i, rho = 0 and mu = 0
this is FedAvg. The official server momentum ``gmf`` (buf <- gmf buf + U/lr; x <- x - lr buf on the
normalized update U) is, for a constant lr, ``server_optimizer=heavy_ball_server(1.0, gmf)``; the
default ``server_optimizer`` is sgd(1), i.e. gmf = 0, the code's default.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from fljax.algorithms.base import Algorithm, ClientContext, LocalSGD, tree_scale, tree_sub
from fljax.algorithms.fedavg import fedavg
from fljax.algorithms.transforms import add_proximal
from fljax.errors import FljaxError
from fljax.hyperparams import NON_NEGATIVE, check, concrete, is_traced, is_value


def select(condition, update: Callable[[Any], Any], value: Any) -> Any:
    """``update(value)`` where ``condition`` holds, else ``value``: chosen in Python for a concrete
    condition (the program holds one branch), by ``jnp.where`` for a traced one."""
    if not is_traced(condition):
        return update(value) if condition else value
    return jax.tree.map(lambda new, old: jnp.where(condition, new, old), update(value), value)


def normalizer(num_steps: jax.Array, lr: jax.Array, momentum: float, mu: float,
               dtype) -> jax.Array:
    """a_i after ``num_steps`` steps, by the official code's per-step recursion (momentum and mu
    may be traced: each branch is then taken by ``jnp.where``)."""

    def with_momentum(carry):
        a, counter = carry
        counter = counter * momentum + 1.0
        return a + counter, counter

    def step(_, carry):
        carry = select(momentum != 0, with_momentum, carry)
        carry = select(mu != 0, lambda c: (c[0] * (1.0 - lr * mu) + 1.0, c[1]), carry)
        return select((momentum == 0) & (mu == 0), lambda c: (c[0] + 1.0, c[1]), carry)

    zero = jnp.zeros((), dtype)
    a, _ = jax.lax.fori_loop(0, num_steps, step, (zero, zero))
    return a


def fednova(local: LocalSGD, *, mu: float = 0.0,
            server_optimizer: optax.GradientTransformation | None = None,
            name: str = "fednova") -> Algorithm:
    """FedNova on torch-style local SGD ``local`` (its momentum is rho) with proximal ``mu``."""
    if not isinstance(local, LocalSGD):
        raise FljaxError(f"fednova needs a LocalSGD local optimizer (its normalizer reads the lr "
                         f"and momentum), got {type(local).__name__}")
    check("mu", mu, NON_NEGATIVE, ">= 0 and finite")
    rho = concrete(local.momentum)
    if rho is not None and not 0 <= rho < 1:
        raise FljaxError(f"fednova needs the local momentum in [0, 1), got {local.momentum}")
    base = fedavg(local, server_optimizer, name=name)

    def client_tx(ctx: ClientContext) -> optax.GradientTransformation:
        terms = [] if is_value(mu, 0.0) else [add_proximal(mu, ctx.params)]
        return local.chain(ctx.round, loss_terms=terms)

    def client_end(ctx: ClientContext, start, end):
        del start
        p = ctx.weight
        lr = jnp.asarray(local.lr(ctx.round), p.dtype)
        a = normalizer(ctx.num_steps, lr, local.momentum, mu, p.dtype)
        tau = ctx.num_steps.astype(p.dtype)
        return ctx.client_state, (tree_scale(p / a, tree_sub(ctx.params, end)), p * a, p * tau)

    def server_update(params, state, message, round_index):
        normalized, weighted_a, weighted_tau = message
        tau_eff = select(mu != 0, lambda _: weighted_tau, weighted_a)
        return base.server_update(params, state, tree_scale(tau_eff, normalized), round_index)

    return base._replace(client_tx=client_tx, client_end=client_end, server_update=server_update)
