"""First-order meta-learning as federated learning: Reptile and FOMAML.

Nichol, Achiam, Schulman, "On First-Order Meta-Learning Algorithms", arXiv:1803.02999, 2018; the
single-model baselines of FedDecay (Anonymous, 2023; eq. 3), as in FederatedScope's
``trainer_FOMAML.py``.

Every sampled client i is a task: K_i local optimizer steps theta_i^0 = w^t -> theta_i^K. The
server takes a meta step of size eps_t along the cohort's weighted mean of

    Reptile:  theta_i^K - w^t               (method gradient sum_j g_i^j, eq. 3's FedAvg)
    FOMAML:   theta_i^K - theta_i^{K-1}     (only the last period's change: g_i^{K-1})

    w^{t+1} = w^t + eps_t sum_{i in S} p_i (change_i).

FederatedScope's FOMAML client returns theta_0 + (theta_K - theta_{K-1}) to FedAvg, i.e. eps = 1.
By default theta_{K-1} is the model before the last local step (``per="step"``, the paper's rule);
FederatedScope's K counts local epochs, which is ``per="epoch"`` (the model at the start of the
last local epoch). Its committed trainer
cannot run, so this follows its stated intent. The Reptile code (``openai/supervised-reptile``)
interpolates w <- w + eps_t (mean_i theta_i^K - w) with eps_t annealed linearly from
``meta_step`` to ``meta_step_final`` over the meta-iterations, which is
``meta_step_size=optax.linear_schedule(meta_step, meta_step_final, rounds)`` here; its defaults are
0.1 and 0.1, its README's runs 1 -> 0. The default here, eps = 1, makes Reptile FedAvg (the FedDecay
paper's identification) and FOMAML FederatedScope's rule. Both papers average tasks equally: run
with ``aggregation="uniform"`` for that.

FOMAML needs theta_i^{K-1} at the end of local training, where the client sees only theta_i^0 and
theta_i^K. Its local optimizer keeps theta_i^0 and theta_i^p, the model at the start of the
current period, in its state, and at the client's last local step applies u_K + theta_i^0 -
theta_i^p instead of the step's update u_K: the local model ends at theta_i^0 + (theta_i^K -
theta_i^p), and FedAvg's client and server finish the round. No engine change is needed.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from fljax.algorithms.base import (Algorithm, ClientContext, ClientOptimizer, LocalSGD, Params,
                                   tree_sub)
from fljax.algorithms.fedavg import fedavg
from fljax.algorithms.feddecay import check_period, period_length
from fljax.hyperparams import POSITIVE, check


def reptile(client_optimizer: LocalSGD | optax.GradientTransformation | ClientOptimizer,
            meta_step_size: float | optax.Schedule = 1.0, *, name: str = "reptile") -> Algorithm:
    """Reptile: w <- w + eps_t sum_S p_i (theta_i^K - w); eps_t a float or a schedule of rounds."""
    if not callable(meta_step_size):
        check("meta_step_size", meta_step_size, POSITIVE,
              "> 0 and finite, or a schedule of the round")
    return fedavg(client_optimizer, optax.sgd(meta_step_size), name=name)


class LastPeriodState(NamedTuple):
    count: jax.Array        # shape=(), int32: local steps taken
    start: Params           # theta^0
    period_start: Params    # theta^p, the model at the start of the current period


def keep_last_period(num_steps: jax.Array, period: jax.Array) -> optax.GradientTransformation:
    """Chained after a local optimizer: its last step (of ``num_steps``) moves the local model to
    theta^0 + (theta^K - theta^p), p the start of the last period of ``period`` steps."""

    def init(params):
        return LastPeriodState(jnp.zeros((), jnp.int32), params, params)

    def update(updates, state, params=None):
        if params is None:
            raise ValueError("keep_last_period needs the params in update()")
        new_period = state.count % period == 0
        period_start = jax.tree.map(lambda p, old: jnp.where(new_period, p, old), params,
                                    state.period_start)
        rewind = tree_sub(state.start, period_start)
        last = state.count == num_steps - 1
        updates = jax.tree.map(lambda u, r: jnp.where(last, u + r, u), updates, rewind)
        return updates, LastPeriodState(state.count + 1, state.start, period_start)

    return optax.GradientTransformation(init, update)


def fomaml(client_optimizer: LocalSGD | optax.GradientTransformation | ClientOptimizer,
           meta_step_size: float | optax.Schedule = 1.0, per: str = "step") -> Algorithm:
    """FOMAML: w <- w + eps_t sum_S p_i (theta_i^K - theta_i^{K-1}), K counted in ``per``."""
    check_period(per)
    base = reptile(client_optimizer, meta_step_size, name="fomaml")

    def client_tx(ctx: ClientContext) -> optax.GradientTransformation:
        return optax.chain(base.client_tx(ctx),
                           keep_last_period(ctx.num_steps, period_length(ctx, per)))

    return base._replace(client_tx=client_tx)
