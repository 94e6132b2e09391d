"""FedDecay: the local learning rate decays within each round, for any algorithm.

FedDecay (Anonymous, 2023, eq. 4): client i's local step k of round n is

    theta_i^k = theta_i^{k-1} - eta * beta_j * g_i^{k-1},        k = 1..K,

a cyclic learning rate eta_t = eta * beta_{t mod K} that restarts at beta_0 = 1 every round, so
the method gradient is g_FedDecay = sum_j beta_j g_i^j (eq. 5). The decay is

    exponential (eq. 4):                      beta_j = beta^j
    linear (appendix B.3):                    beta_j = max(1 - j (1 - beta), 0)
    linear_code (the official code's linear): beta_j = max(0, 1 - beta j)

with beta in [0, 1] for all: beta = 1 is FedAvg (every beta_j = 1) for the paper's two, and
beta = 0 with a decay per step is FedSGD-like (only the first local step moves). j is the local
step index (``per="step"``, eq. 4) or the local epoch index floor(k / ceil(n_i / B))
(``per="epoch"``, the official code's default, where the coefficient advances once per local
epoch).

The official code (FederatedScope ``trainer_decay.py``) differs in two ways. Its linear scheme is
max(0, 1 - beta j), not the paper's 1 - j (1 - beta): the code's beta is the paper's 1 - beta, so
its beta = 0 is FedAvg and beta = 1 keeps only the first period. The paper's appendix B.3 states
the first, but its tuned "FedDecay - Linear" betas (Tables 8-10: 0.6, 0.4, 0.4) were found with the
code's, so ``schedule="linear_code"`` takes them as they are (linear_code with beta equals linear
with 1 - beta). In its default epoch mode it takes a whole epoch at the undecayed rate and then
shrinks that epoch's displacement by beta_j; its batch mode shrinks each
step's displacement, which is the learning-rate decay here (gradients are taken at the decayed
iterates) with the coefficient advancing per epoch (``per="epoch"``).

``shrink=True`` runs the code's epoch mode: every period (``per``) runs at the undecayed learning
rate, and at its last step the local model is moved to

    theta <- theta_p + beta_j (theta - theta_p),         theta_p = the model at the period's start,

i.e. ``on_epoch_end``'s ``theta_start_epoch + s_e (theta - theta_start_epoch)``; the optimizer
state (momentum buffer) carries on unchanged, as torch's does. The iterates differ from the
learning-rate decay (the gradients of period j are taken along the undecayed path); per step both
are the same. A last period cut short by ``local_steps`` is shrunk at the client's last step (the
code's ``_run_routine`` breaks out of a partial last epoch and still runs ``on_epoch_end``).

A local step of the wrapped algorithm ends in SGD, whose step is linear in the learning rate, so the
decay scales the algorithm's final local update: ``optax.chain(client_tx, scale beta_j)``. With
torch-style momentum (buf <- mu buf + d; y <- y - eta buf) the buffer does not involve the
learning rate, so scaling the update by beta_j is exactly SGD with learning rate eta beta_j. The
schedule's counter starts at 0 with every client's local optimizer, so the decay restarts each
round. Every beta_j = 1 (beta = 1; beta = 0 for linear_code) returns the algorithm itself (a
multiplication by 1 is exact, but it changes how XLA fuses the step, and so its rounding, by an
ulp). Algorithms whose client message divides by the
local learning rate (SCAFFOLD option II, FedNova) keep dividing by the undecayed one.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from fljax.algorithms.base import Algorithm, ClientContext, ClientOptimizer, LocalSGD, Params
from fljax.algorithms.fedavg import fedavg
from fljax.errors import FljaxError
from fljax.hyperparams import check, is_traced, is_value

SCHEDULES = ("exponential", "linear", "linear_code")
PERIODS = ("step", "epoch")


def check_period(per: str) -> None:
    """``per`` names the unit local work is counted in: one local step or one local epoch."""
    if per not in PERIODS:
        raise FljaxError(f"per must be one of {PERIODS}, got {per!r}")


def period_length(ctx: ClientContext, per: str) -> jax.Array:
    """Local steps per period: 1 (``per="step"``) or ceil(n_i / B) (``per="epoch"``)."""
    return jnp.ones((), jnp.int32) if per == "step" else ctx.steps_per_epoch


def decay_coefficient(beta: float, schedule: str, j: jax.Array) -> jax.Array:
    """beta_j: beta**j (exponential), max(1 - j (1 - beta), 0) (linear) or max(0, 1 - beta j)
    (linear_code)."""
    if schedule == "exponential":
        return beta ** j
    if schedule == "linear_code":
        return jnp.maximum(1.0 - beta * j, 0.0)
    return jnp.maximum(1.0 - j * (1.0 - beta), 0.0)


class ShrinkState(NamedTuple):
    count: jax.Array          # shape=(), int32: local steps taken
    period_start: Params      # theta_p, the model at the start of the current period


def shrink_periods(coefficient, period: jax.Array,
                   num_steps: jax.Array) -> optax.GradientTransformation:
    """Chained after a local optimizer: the last step of period j (every ``period`` steps, and
    the client's last of ``num_steps``) lands on theta_p + coefficient(j) (theta - theta_p)."""

    def init(params):
        return ShrinkState(jnp.zeros((), jnp.int32), params)

    def update(updates, state, params=None):
        if params is None:
            raise ValueError("shrink_periods needs the params in update()")
        k = state.count
        start = jax.tree.map(lambda p, old: jnp.where(k % period == 0, p, old), params,
                             state.period_start)
        ends = ((k + 1) % period == 0) | (k == num_steps - 1)
        b = coefficient(k // period)
        updates = jax.tree.map(
            lambda u, p, s: jnp.where(ends, (s + b * (p + u - s) - p).astype(u.dtype), u),
            updates, params, start)
        return updates, ShrinkState(k + 1, start)

    return optax.GradientTransformation(init, update)


def local_decay(algorithm: Algorithm, beta: float, schedule: str = "exponential",
                per: str = "epoch", *, shrink: bool = False,
                name: str | None = None) -> Algorithm:
    """``algorithm`` with its local learning rate scaled by beta_j in the j-th local period
    (``shrink=True``: each period's displacement scaled at its end, the official code's rule)."""
    check("beta (the local decay)", beta, lambda v: 0.0 <= v <= 1.0, "in [0, 1]")
    if schedule not in SCHEDULES:
        raise FljaxError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    check_period(per)
    name = name or f"{algorithm.name}+decay"
    if is_value(beta, 0.0 if schedule == "linear_code" else 1.0):
        # every beta_j = 1: the algorithm itself, bit for bit (a traced beta never takes this)
        return algorithm._replace(name=name)
    if not is_traced(beta):
        beta = float(beta)       # an integer beta must not make beta**j an integer power

    def client_tx(ctx: ClientContext) -> optax.GradientTransformation:
        period = period_length(ctx, per)
        if shrink:
            decay = shrink_periods(lambda j: decay_coefficient(beta, schedule, j), period,
                                   ctx.num_steps)
        else:
            decay = optax.scale_by_schedule(
                lambda step: decay_coefficient(beta, schedule, step // period))
        return optax.chain(algorithm.client_tx(ctx), decay)

    return algorithm._replace(name=name, client_tx=client_tx)


def feddecay(client_optimizer: LocalSGD | optax.GradientTransformation | ClientOptimizer,
             beta: float, schedule: str = "exponential", per: str = "epoch",
             server_optimizer: optax.GradientTransformation | None = None, *,
             shrink: bool = False) -> Algorithm:
    """FedDecay: FedAvg (server optimizer default sgd(1)) with the local decay beta_j."""
    return local_decay(fedavg(client_optimizer, server_optimizer), beta, schedule, per,
                       shrink=shrink, name="feddecay")
