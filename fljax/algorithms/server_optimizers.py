"""Server optimizers on the pseudo-gradient: FedAvgM (two forms), FedAdam, FedYogi, FedAdagrad.

Hsu, Qi, Brown, "Measuring the Effects of Non-Identical Data Distribution for Federated Visual
Classification", arXiv 2019 (FedAvgM); Reddi, Charles, Zaheer, Garrett, Rush, Konecny, Kumar,
McMahan, "Adaptive Federated Optimization", ICLR 2021 (Algorithm 2: FedAdagrad, FedAdam, FedYogi).

fljax's ``fedavg(local, server_optimizer)`` hands the server optax transformation the
gradient-signed pseudo-gradient g = sum_{i in S} p_i (x - y_i,K) and sets x <- x + update. The
paper's Delta_t = mean_S (y_i,K - x) is -g. With Delta = -g, exactly as Reddi et al. write it (NO
bias correction, tau outside the square root):

    m_t = b1 m_{t-1} + (1 - b1) Delta_t                                       (all three)
    v_t = v_{t-1} + Delta_t^2                                                 FedAdagrad
    v_t = b2 v_{t-1} + (1 - b2) Delta_t^2                                     FedAdam
    v_t = v_{t-1} - (1 - b2) Delta_t^2 sign(v_{t-1} - Delta_t^2)              FedYogi
    x  <- x + eta m_t / (sqrt(v_t) + tau)

with m_{-1} = 0 and v_{-1} = ``initial_v``: 0 as FedDecorr's ``approach/fedoptim.py`` does (the
default, with its b1 = 0.9, b2 = 0.99, tau = 1e-3, eta = 1), or tau**2 as the paper suggests
(v_{-1} >= tau^2). No configuration of this family is FedAvg (even b1 = 0 leaves the per-coordinate
division by sqrt(v) + tau). Not copied: the FedExP code's Adam, which divides m by 0.1 and v by 0.01
and puts its eps inside the square root, and its Adagrad g / sqrt(v + 0.01); FedBug's fedadam, which
never updates the model.

FedAvgM comes in the two forms the official codes use:

    heavy ball (FedExP ``main.py``):  v <- beta v + Delta;             x <- x + eta v
    EMA (FedDecorr, MOON, FedBug):    m <- beta m + (1 - beta) Delta;  x <- x + eta m   (eta = 1)

Momentum 0 makes both FedAvg with server step eta exactly.

Every number (eta, momentum, b1, b2, tau, initial_v) may be a scalar array, traced too
(``fljax.hyperparams``); ``dampened`` is structural.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fljax.algorithms.base import Algorithm, ClientOptimizer, LocalSGD, Params
from fljax.algorithms.fedavg import fedavg
from fljax.hyperparams import NON_NEGATIVE, POSITIVE, check


UNIT = lambda v: 0.0 <= v < 1.0     # check(name, value, UNIT, "in [0, 1)")


# ---------------------------------------------------------------------------------------------
# FedAvgM


def heavy_ball_server(learning_rate: float, momentum: float = 0.9
                      ) -> optax.GradientTransformation:
    """v <- momentum v + Delta; x <- x + learning_rate v (the FedExP code's FedAvgM, undampened).

    On g = -Delta this is torch/optax heavy-ball SGD: buf <- momentum buf + g; x <- x - lr buf.
    """
    check("learning_rate", learning_rate, POSITIVE, "> 0 and finite")
    check("momentum", momentum, UNIT, "in [0, 1)")
    return optax.sgd(learning_rate, momentum=momentum)


def ema_momentum_server(learning_rate: float = 1.0, momentum: float = 0.9
                        ) -> optax.GradientTransformation:
    """m <- momentum m + (1 - momentum) Delta; x <- x + learning_rate m (FedDecorr/MOON/FedBug)."""
    check("learning_rate", learning_rate, POSITIVE, "> 0 and finite")
    check("momentum", momentum, UNIT, "in [0, 1)")
    return optax.chain(optax.ema(momentum, debias=False),
                       optax.scale_by_learning_rate(learning_rate))


# ---------------------------------------------------------------------------------------------
# FedAdagrad / FedAdam / FedYogi


class AdaptiveServerState(NamedTuple):
    """Reddi et al.'s moments, on the gradient-signed pseudo-gradient g = -Delta."""

    m: Params   # = -m_t of the paper (first moment of g)
    v: Params   # = v_t of the paper (even in Delta)


SecondMoment = Callable[[jax.Array, jax.Array], jax.Array]   # (v, g**2) -> new v


def scale_by_reddi(second_moment: SecondMoment, b1: float, tau: float, initial_v: float
                   ) -> optax.GradientTransformation:
    """g -> m / (sqrt(v) + tau), m = b1 m + (1 - b1) g, v = second_moment(v, g^2); no debiasing."""

    def init(params):
        return AdaptiveServerState(m=jax.tree.map(jnp.zeros_like, params),
                                   v=jax.tree.map(lambda p: jnp.full_like(p, initial_v), params))

    def update(updates, state, params=None):
        del params
        m = jax.tree.map(lambda mt, g: (b1 * mt + (1.0 - b1) * g).astype(mt.dtype), state.m,
                         updates)
        v = jax.tree.map(lambda vt, g: second_moment(vt, g * g).astype(vt.dtype), state.v,
                         updates)
        scaled = jax.tree.map(lambda mt, vt: (mt / (jnp.sqrt(vt) + tau)).astype(mt.dtype), m, v)
        return scaled, AdaptiveServerState(m=m, v=v)

    return optax.GradientTransformation(init, update)


def _adaptive_server(second_moment: SecondMoment, learning_rate: float, b1: float, tau: float,
                     initial_v: float) -> optax.GradientTransformation:
    check("learning_rate", learning_rate, POSITIVE, "> 0 and finite")
    check("b1", b1, UNIT, "in [0, 1)")
    check("tau", tau, POSITIVE, "> 0 and finite")
    check("initial_v", initial_v, NON_NEGATIVE, ">= 0 and finite")
    return optax.chain(scale_by_reddi(second_moment, b1, tau, initial_v),
                       optax.scale_by_learning_rate(learning_rate))


def fedadam_server(learning_rate: float, b1: float = 0.9, b2: float = 0.99, tau: float = 1e-3,
                   initial_v: float = 0.0) -> optax.GradientTransformation:
    """FedAdam: v = b2 v + (1 - b2) Delta^2; x += lr m / (sqrt(v) + tau)."""
    check("b2", b2, UNIT, "in [0, 1)")
    return _adaptive_server(lambda v, g2: b2 * v + (1.0 - b2) * g2,
                            learning_rate, b1, tau, initial_v)


def fedyogi_server(learning_rate: float, b1: float = 0.9, b2: float = 0.99, tau: float = 1e-3,
                   initial_v: float = 0.0) -> optax.GradientTransformation:
    """FedYogi: v = v - (1 - b2) Delta^2 sign(v - Delta^2); x += lr m / (sqrt(v) + tau)."""
    check("b2", b2, UNIT, "in [0, 1)")
    return _adaptive_server(lambda v, g2: v - (1.0 - b2) * g2 * jnp.sign(v - g2),
                            learning_rate, b1, tau, initial_v)


def fedadagrad_server(learning_rate: float, b1: float = 0.9, tau: float = 1e-3,
                      initial_v: float = 0.0) -> optax.GradientTransformation:
    """FedAdagrad: v = v + Delta^2; x += lr m / (sqrt(v) + tau)."""
    return _adaptive_server(lambda v, g2: v + g2, learning_rate, b1, tau, initial_v)


# ---------------------------------------------------------------------------------------------
# Algorithms: fedavg with these server optimizers

LocalOptimizer = LocalSGD | optax.GradientTransformation | ClientOptimizer


def fedavgm(local: LocalOptimizer, *, server_lr: float = 1.0, momentum: float = 0.9,
            dampened: bool = False, name: str = "fedavgm") -> Algorithm:
    """FedAvg with server momentum: heavy ball (default, FedExP code) or ``dampened`` EMA."""
    check("server_lr", server_lr, POSITIVE, "> 0 and finite")
    check("momentum", momentum, UNIT, "in [0, 1)")
    server = ema_momentum_server if dampened else heavy_ball_server
    return fedavg(local, server(server_lr, momentum), name=name)


def fedadam(local: LocalOptimizer, *, server_lr: float = 1.0, b1: float = 0.9, b2: float = 0.99,
            tau: float = 1e-3, initial_v: float = 0.0, name: str = "fedadam") -> Algorithm:
    """FedAvg with Reddi et al.'s FedAdam server (FedDecorr defaults)."""
    check("server_lr", server_lr, POSITIVE, "> 0 and finite")
    return fedavg(local, fedadam_server(server_lr, b1, b2, tau, initial_v), name=name)


def fedyogi(local: LocalOptimizer, *, server_lr: float = 1.0, b1: float = 0.9, b2: float = 0.99,
            tau: float = 1e-3, initial_v: float = 0.0, name: str = "fedyogi") -> Algorithm:
    """FedAvg with Reddi et al.'s FedYogi server (FedDecorr defaults)."""
    check("server_lr", server_lr, POSITIVE, "> 0 and finite")
    return fedavg(local, fedyogi_server(server_lr, b1, b2, tau, initial_v), name=name)


def fedadagrad(local: LocalOptimizer, *, server_lr: float = 1.0, b1: float = 0.9,
               tau: float = 1e-3, initial_v: float = 0.0, name: str = "fedadagrad") -> Algorithm:
    """FedAvg with Reddi et al.'s FedAdagrad server (FedDecorr defaults)."""
    check("server_lr", server_lr, POSITIVE, "> 0 and finite")
    return fedavg(local, fedadagrad_server(server_lr, b1, tau, initial_v), name=name)
