"""FedInit: personalized relaxed initialization (+RI) for any algorithm.

Sun, Shen, Tao, "Understanding How Consistency Works in Federated Learning via Stage-wise Relaxed
Initialization", NeurIPS 2023 (FedInit, Algorithm 1); FL-Simulator
(``woodenchild95/FL-Simulator``, ``server/*.py:process_for_communication``, ``--use-RI --beta``) by
the same first author.

Every client i has a last local model w_i,K^{prev}, the end of its latest local training,
initialised to the initial global model w^0 (Algorithm 1, line 1), so a client never sampled before
starts from w + beta (w - w^0). A sampled client starts its local training from

    w_i,0^t = w^t + beta (w^t - w_i,K^{prev})                       (Algorithm 1, line 6)

and after its local steps w_i,K^{prev} <- w_i,K^t. ``relaxed_init(algorithm, beta)`` adds this to
ANY algorithm, keeping its client state side by side with the last local model. ``aggregate``
chooses the reference point the wrapped algorithm sees as "the broadcast model" (``ctx.params``):

* ``"start"`` (default, FL-Simulator): the relaxed start w_i,0. Updates are relative to it, so
  FedAvg becomes w^{t+1} = w^t + sum_S p_i (w_i,K - w_i,0) = sum_S p_i w_i,K - beta (w^t -
  sum_S p_i w_i,K^{prev}); SCAFFOLD's c_i+ = c_i - c + (w_i,0 - w_i,K)/(K eta); FedDyn's linear
  term is alpha (h_i - w_i,0) and h_i += w_i,K - w_i,0; FedProx's prox centre is w_i,0; server
  optimizers (FedAdam, FedCM) act on the pseudo-gradient sum_S p_i (w_i,0 - w_i,K) at w^t.
  A wrapped client_start (e.g. FedGA's displacement) is applied from w_i,0.
* ``"final"`` (the paper's Algorithm 1, line 13: w^{t+1} = 1/N sum_{i in N} w_i,K): the wrapped
  algorithm still sees w^t; only the start moves, by beta (w^t - w_i,K^{prev}) on top of the
  wrapped client_start. FedAvg becomes w^{t+1} = sum_S p_i w_i,K, the average of the final local
  models; corrections (SCAFFOLD's c_i, FedDyn's h_i) then include the displacement.
* ``"mixed"``: the clients as ``"start"`` (the wrapped algorithm centred on w_i,0, its client
  state updated relative to it), the server's model average over the final local models as
  ``"final"``: the model part of each message is re-measured from w^t by the wrapped algorithm's
  ``rebase`` hook (the shift -beta (w^t - w_i,K^{prev})). It needs an algorithm that declares
  ``rebase`` (FedDyn does); it is FL-Simulator's FedDyn + RI.

The default is ``"start"``: it is the first author's released code (FL-Simulator's README reports
the FedInit runs), used there for FedInit and every +RI method alike (Table 2), and it composes
with every server rule unchanged. For FedAvg it differs from the paper's aggregation by
beta (w^t - sum_S p_i w_i,K^{prev}). Algorithm 1's 1/N is the engine's aggregation='uniform'.

FedDyn + RI (Table 2's FedDyn column) is the one method where neither of the first two modes is
FL-Simulator's. With s_i = w_i,0 the relaxed start, r_i the point FedDyn's client is centred on, H = mean over ALL
clients of h, and unweighted means over S, the local gradient is
clip(g + alpha (h_i - r_i)) + (wd + alpha) y, then h_i += w_i,K - r_i, and

    Algorithm 1 + FedDyn (``"final"``):  r_i = w^t,  w^{t+1} = mean_S w_i,K + H
    FL-Simulator (FedDyn.py, feddyn.py): r_i = s_i,  w^{t+1} = mean_S w_i,K + H
    fljax ``"start"``:                   r_i = s_i,  w^{t+1} = w^t + mean_S (w_i,K - s_i) + H
                                           = FL-Simulator's - beta (w^t - mean_S w_i,K^{prev}).
    fljax ``"mixed"``:                   r_i = s_i,  w^{t+1} = mean_S w_i,K + H   (FL-Simulator's)

Algorithm 1 states RI for FedAvg only and calls it "irrelevant to the local optimizer", so applied
to FedDyn it moves only the start and keeps FedDyn's own centre and server (line 13's average of the
final models, plus FedDyn's correction): that is ``"final"``. FL-Simulator centres the client and
the h update on the relaxed start, as ``"start"`` does, but averages the final models, as
``"final"`` does: one message holds FedDyn's model average relative to w^t and its h increment
relative to s_i, which is why ``"mixed"`` needs FedDyn's ``rebase`` (it moves the first and
keeps the second). The three rules are checked against float64 references
(tests/test_fedinit_fedga.py).

beta = 0 is the wrapped algorithm exactly (either aggregation). beta may be negative: the
paper's Table 3 tries beta < 0 (a start pulled towards the client's previous model) to show that
it hurts.

Divergence (``client_metrics``): each sampled client reports ||w_i,K^{prev} - w^t||^2, its stored
last local model (w^0 if never sampled) against the broadcast model, before it trains; the round
reports the unweighted mean over the sampled cohort S^t,

    divergence^t = 1/|S^t| sum_{i in S^t} ||w_i,K^{prev} - w^t||^2,

an unbiased estimate under uniform sampling of the paper's Delta^t = 1/C sum_{all i}
||w_i,K^{t-1} - w^t||^2 (Theorem 3). FL-Simulator's logged divergence is after the round instead:
1/|S^t| sum_{i in S^t} ||w_i,K^t - w^{t+1}||^2.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fljax.registry import declare
from fljax.algorithms.base import Algorithm, ClientContext, LocalSGD, Params, tree_sub
from fljax.algorithms.fedavg import fedavg
from fljax.errors import FljaxError
from fljax.hyperparams import check

AGGREGATES = ("start", "final", "mixed")


class RelaxedClientState(NamedTuple):
    last_model: Params   # w_i,K^{prev}: the end of the latest local training (w^0 before any)
    inner: Any           # the wrapped algorithm's client state


def relaxed_init(algorithm: Algorithm, beta: float, aggregate: str = "start") -> Algorithm:
    """``algorithm`` with clients starting from w + beta (w - w_i,K^{prev}) (+RI)."""
    check("beta", beta, math.isfinite, "a finite number (negative values pull the start "
          "towards the client's previous model)")
    if aggregate not in AGGREGATES:
        raise FljaxError(f"aggregate must be one of {AGGREGATES}, got {aggregate!r}")
    if aggregate == "mixed" and algorithm.rebase is None:
        raise FljaxError(f"aggregate 'mixed' needs an algorithm that declares how its message "
                         f"moves with its reference point (Algorithm.rebase, as feddyn does); "
                         f"{algorithm.name} does not (for FedAvg 'mixed' would be 'final')")

    def offset(ctx: ClientContext) -> Params:
        """beta (w - w_i,K^{prev})."""
        return jax.tree.map(lambda w, last: (beta * (w - last)).astype(w.dtype), ctx.params,
                            ctx.client_state.last_model)

    def view(ctx: ClientContext) -> ClientContext:
        """The context the wrapped algorithm sees: its own state, and w_i,0 or w as the model."""
        inner_ctx = ctx._replace(client_state=ctx.client_state.inner)
        if aggregate == "final":
            return inner_ctx
        return inner_ctx._replace(params=jax.tree.map(jnp.add, ctx.params, offset(ctx)))

    def client_init(params):
        return RelaxedClientState(last_model=params, inner=algorithm.client_init(params))

    def client_start(ctx: ClientContext, key: jax.Array) -> Params:
        start = algorithm.client_start(view(ctx), key)
        if aggregate == "final":
            return jax.tree.map(jnp.add, start, offset(ctx))
        return start

    def client_tx(ctx: ClientContext) -> optax.GradientTransformation:
        return algorithm.client_tx(view(ctx))

    def client_loss(ctx: ClientContext, loss_fn):
        return algorithm.client_loss(view(ctx), loss_fn)

    def client_end(ctx: ClientContext, start, end):
        inner, message = algorithm.client_end(view(ctx), start, end)
        if aggregate == "mixed":   # the model part from w^t = w_i,0 - beta (w^t - w_i,K^prev)
            message = algorithm.rebase(view(ctx), message,
                                       jax.tree.map(jnp.negative, offset(ctx)))
        return RelaxedClientState(last_model=end, inner=inner), message

    def client_metrics(ctx: ClientContext, start, end):
        drift = tree_sub(ctx.client_state.last_model, ctx.params)
        divergence = sum(jnp.sum(jnp.square(leaf)) for leaf in jax.tree.leaves(drift))
        return {**algorithm.client_metrics(view(ctx), start, end), "divergence": divergence}

    cohort_start = None
    if algorithm.cohort_start is not None:
        cohort_start = lambda ctx: algorithm.cohort_start(view(ctx))

    return algorithm._replace(name=f"{algorithm.name}+ri", client_init=client_init,
                              client_start=client_start, client_tx=client_tx,
                              client_loss=client_loss, client_end=client_end,
                              cohort_start=cohort_start, client_metrics=client_metrics,
                              rebase=None,
                              client_vectors=lambda ctx: algorithm.client_vectors(view(ctx)),
                              personal_model=None if algorithm.personal_model is None else (
                                  lambda params, server_state, state: algorithm.personal_model(
                                      params, server_state, state.inner)))


@declare(aggregation="uniform")   # the paper's / official code's unweighted mean
def fedinit(local: LocalSGD | optax.GradientTransformation, beta: float = 0.1,
            aggregate: str = "start",
            server_optimizer: optax.GradientTransformation | None = None) -> Algorithm:
    """FedInit = relaxed_init(FedAvg): default beta = 0.1 (FL-Simulator's ``--beta``)."""
    return relaxed_init(fedavg(local, server_optimizer), beta, aggregate)._replace(name="fedinit")
