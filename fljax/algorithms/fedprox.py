"""FedProx: FedAvg whose clients minimize a proximal local objective.

Li, Sahu, Zaheer, Sanjabi, Talwalkar, Smith, "Federated Optimization in Heterogeneous Networks",
MLSys 2020.

Client k approximately minimizes  h_k(y) = F_k(y) + mu/2 ||y - w^t||^2  with K local steps from
y_k,0 = w^t. The proximal gradient mu (y - w^t) is a term of the loss, so it is clipped together
with the loss gradient (as in the FedDyn code's ``train_fedprox_mdl``, whose loss
CE + mu/2 ||y||^2 - mu <y, w^t> has the same gradient); weight decay is added after clipping:

    y <- y - eta_l decay^t [ clip( g_k(y) + mu (y - w^t) ) + wd * y ]        (torch-style momentum)

The server is FedAvg's: Delta = sum_{k in S} p_k (w^t - y_k,K), w^{t+1} = w^t + ServerOpt(Delta)
(``server_optimizer``, default sgd(1): w^{t+1} = sum_S p_k y_k,K). The FedDyn code weights by n_k
(the engine's aggregation='examples'). mu = 0 is FedAvg exactly.

Default mu = 1e-4 is the FedDyn code's (``alpemreacar/FedDyn``); FL-Simulator uses 0.1 and the paper
sweeps {0.001, 0.01, 0.1, 1}. Not copied: FedDecorr's FedProx, whose anchor aliases the trained
parameters so the proximal term is identically zero.
"""

from __future__ import annotations

import optax

from fljax.algorithms.base import Algorithm, ClientContext, LocalSGD
from fljax.algorithms.fedavg import fedavg
from fljax.algorithms.transforms import add_proximal
from fljax.errors import FljaxError
from fljax.hyperparams import NON_NEGATIVE, check


def fedprox(local: LocalSGD, *, mu: float = 1e-4,
            server_optimizer: optax.GradientTransformation | None = None,
            name: str = "fedprox") -> Algorithm:
    """FedProx with proximal coefficient ``mu`` on the local optimizer ``local``."""
    if not isinstance(local, LocalSGD):
        raise FljaxError(f"fedprox needs a LocalSGD local optimizer (its proximal term is "
                         f"clipped with the loss gradient), got {type(local).__name__}")
    check("mu", mu, NON_NEGATIVE, ">= 0 and finite")

    def client_tx(ctx: ClientContext) -> optax.GradientTransformation:
        return local.chain(ctx.round, loss_terms=[add_proximal(mu, ctx.params)])

    return fedavg(local, server_optimizer, name=name)._replace(client_tx=client_tx)
