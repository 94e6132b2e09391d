"""pFedMe: personalized FL with Moreau envelopes.

T. Dinh, Tran, Nguyen, "Personalized Federated Learning with Moreau Envelopes", NeurIPS 2020
(Algorithm 1), FedDecay's baseline as FederatedScope's ``trainer_pFedMe`` runs it.

Client i minimizes the Moreau envelope of its loss, F_i(w) = min_theta f_i(theta) +
lambda/2 ||theta - w||^2, whose gradient is lambda (w - theta_hat(w)). In each of its R local steps
(R = the round's local steps) on a batch D it

    solves the inner problem approximately: theta <- theta - eta_p [grad f_i(theta; D) +
        lambda (theta - w)], K times on the same batch D, from theta = w;
    takes the outer step w <- w - eta lambda (w - theta_K)            (eta: the local lr).

fljax writes the outer step as the local optimizer on the loss

    F_i(w; D) = f_i(theta_K; D) + lambda/2 ||w - theta_K||^2      (theta_K held constant),

whose value is the envelope and whose gradient is exactly lambda (w - theta_K), so the engine's
local loop, clip and wrappers apply unchanged. The server interpolates,
w^{t+1} = (1 - beta) w^t + beta sum_S p_i w_i,R = w^t - beta sum_S p_i (w^t - w_i,R): FedAvg with
server sgd(beta). Personal model (what the personalized evaluation scores): theta_hat(w_i,R), the
prox at the client's last local model, by R steps of SGD at eta_p on f_i(theta) + lambda/2
||theta - w_i,R||^2 from w_i,R on batches of an independent draw (stream 1); a user that never
trained has none and is scored with the global model. Memory: one model per client (N x params).
``score="global"`` keeps no personal model and scores every user with the (fine-tuned) global
model, as FederatedScope's pFedMe trainer does, and so FedDecay's pFedMe column.

Departure from the official code: its inner solver continues from the previous local step's theta
(a warm start); here each inner solve starts from the current w (the prox at w, as Algorithm 1
states it).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from fljax.algorithms.base import Algorithm, ClientContext, LocalSGD, Params
from fljax.algorithms.fedavg import fedavg
from fljax.algorithms.transforms import add_proximal
from fljax.errors import FljaxError
from fljax.hyperparams import POSITIVE, check


SCORES = ("personal", "global")


class PersonalModel(NamedTuple):
    theta: Params          # theta_hat of the client's last local model
    trained: jax.Array     # shape=(), bool: the client has trained at least once


def moreau_loss(loss_fn, lam: float, inner_lr: float, inner_steps: int):
    """loss(w, x, y, mask, rng) = f(theta_K) + lambda/2 ||w - theta_K||^2 with theta_K from K steps
    of gradient descent on f(theta; batch) + lambda/2 ||theta - w||^2 from theta = w, held
    constant: its gradient is lambda (w - theta_K)."""
    grad_fn = jax.grad(loss_fn)

    def loss(w, x, y, mask, rng):
        anchor = jax.lax.stop_gradient(w)
        theta = anchor
        for _ in range(inner_steps):
            g = grad_fn(theta, x, y, mask, rng)
            theta = jax.tree.map(
                lambda t, gt, a: (t - inner_lr * (gt + lam * (t - a))).astype(t.dtype),
                theta, g, anchor)
        theta = jax.lax.stop_gradient(theta)
        distance = sum(jnp.sum((a - b) ** 2) for a, b in zip(jax.tree.leaves(w),
                                                             jax.tree.leaves(theta)))
        return jax.lax.stop_gradient(loss_fn(theta, x, y, mask, rng)) + lam / 2 * distance

    return loss


def pfedme(local: LocalSGD, *, lam: float = 15.0, inner_steps: int = 5,
           inner_lr: float | None = None, beta: float = 1.0, score: str = "personal",
           name: str = "pfedme") -> Algorithm:
    """pFedMe with regularization ``lam`` (lambda), ``inner_steps`` (K) inner steps at
    ``inner_lr`` (eta_p, default: the local lr) and server interpolation ``beta``; users scored
    with their personal model theta_hat (``score="personal"``) or the global one (``"global"``)."""
    if not isinstance(local, LocalSGD):
        raise FljaxError(f"pfedme needs a LocalSGD local optimizer, got {type(local).__name__}")
    check("lam", lam, POSITIVE, "> 0 and finite")
    if isinstance(inner_steps, bool) or not isinstance(inner_steps, int) or inner_steps < 1:
        raise FljaxError(f"inner_steps must be an integer >= 1, got {inner_steps!r}")
    if inner_lr is not None:
        check("inner_lr", inner_lr, POSITIVE, "> 0 and finite")
    check("beta", beta, POSITIVE, "> 0 and finite")
    if score not in SCORES:
        raise FljaxError(f"score must be one of {SCORES}, got {score!r}")
    eta_p = local.learning_rate if inner_lr is None else inner_lr
    base = fedavg(local, optax.sgd(beta), name=name)

    def client_loss(ctx: ClientContext, loss_fn):
        return moreau_loss(loss_fn, lam, eta_p, inner_steps)

    if score == "global":
        return base._replace(client_loss=client_loss)

    def client_end(ctx: ClientContext, start, end):
        prox = optax.chain(add_proximal(lam, end), optax.sgd(eta_p))
        theta = ctx.train(prox, end, 1)
        return PersonalModel(theta, jnp.ones((), bool)), base.client_end(ctx, start, end)[1]

    def personal_model(params, server_state, mine: PersonalModel):
        return jax.tree.map(lambda t, w: jnp.where(mine.trained, t, w), mine.theta, params)

    return base._replace(
        client_init=lambda params: PersonalModel(params, jnp.zeros((), bool)),
        client_loss=client_loss, client_end=client_end, personal_model=personal_model)

