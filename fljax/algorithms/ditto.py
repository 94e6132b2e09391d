"""Ditto: a global model by FedAvg and a personal model per client, pulled toward it.

Li, Hu, Beirami, Smith, "Ditto: Fair and Robust Federated Learning Through Personalization",
ICML 2021 (Algorithm 1), as FederatedScope's ``trainer_Ditto`` runs it (FedDecay's baseline).

Client k keeps a personal model v_k (client state, v_k = w^0 until it first trains). When sampled in
round t it receives w^t and
- trains the global model exactly as FedAvg does: K local steps of the local optimizer from w^t,
  sending Delta_k = w^t - y_k,K (the server: w^{t+1} = w^t + ServerOpt(sum_S p_k Delta_k));
- trains its personal model on h_k(v) = F_k(v) + lambda/2 ||v - w^t||^2 for as many steps, on
  batches of an independent draw (``ClientContext.train``, stream 1), with the same local optimizer
  at ``personal_lr`` (default: the local lr); lambda (v - w^t) is a term of the loss, clipped with
  the loss gradient as FederatedScope's regularized optimizer adds it before the step:

      v <- v - eta_p [ clip( g_k(v) + lambda (v - w^t) ) + wd * v ].

The personal model is what the personalized evaluation scores for client k; a user that never
trained (a new user) holds v = w^0, as in FederatedScope, which is why Ditto's new-user accuracy
is low in FedDecay (Anonymous, 2023) Table 3. lambda = 0 trains the personal model alone; the global
model is FedAvg's exactly. Memory: one model per client (N x params), kept on the device with the
state.
"""

from __future__ import annotations

import optax

from fljax.algorithms.base import Algorithm, ClientContext, LocalSGD
from fljax.algorithms.fedavg import fedavg
from fljax.algorithms.transforms import add_proximal
from fljax.errors import FljaxError
from fljax.hyperparams import NON_NEGATIVE, POSITIVE, check


def ditto(local: LocalSGD, *, lam: float = 0.5, personal_lr: float | None = None,
          server_optimizer: optax.GradientTransformation | None = None,
          name: str = "ditto") -> Algorithm:
    """Ditto with regularization ``lam`` (lambda); ``personal_lr`` defaults to the local lr."""
    if not isinstance(local, LocalSGD):
        raise FljaxError(f"ditto needs a LocalSGD local optimizer (its proximal term is clipped "
                         f"with the loss gradient), got {type(local).__name__}")
    check("lam", lam, NON_NEGATIVE, ">= 0 and finite")
    if personal_lr is not None:
        check("personal_lr", personal_lr, POSITIVE, "> 0 and finite")
    personal = local if personal_lr is None else local._replace(learning_rate=personal_lr)
    base = fedavg(local, server_optimizer, name=name)

    def client_end(ctx: ClientContext, start, end):
        tx = personal.chain(ctx.round, loss_terms=[add_proximal(lam, ctx.params)])
        mine = ctx.train(tx, ctx.client_state, 1)
        return mine, base.client_end(ctx, start, end)[1]

    return base._replace(client_init=lambda params: params, client_end=client_end,
                         personal_model=lambda params, server_state, mine: mine)
