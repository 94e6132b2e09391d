"""FedDecay, FOMAML and Reptile equal float64 references written from their equations.

FedDecay (Anonymous, 2023; eq. 4, appendix B.3): local step k of client i uses the learning rate
eta decay^t beta_j, j = k (per step) or floor(k / ceil(n_i / B)) (per epoch), beta_j = beta^j or
max(1 - j (1 - beta), 0) (the paper's linear) or max(0, 1 - beta j) (the official code's linear),
restarting every round; or (``shrink``, the official code's epoch mode) each period at the full
lr, its displacement then scaled by beta_j. FOMAML / Reptile (Nichol et al. 2018): the server
moves by eps_t sum_S p_i (theta_K - theta_p) with theta_p the model at the start of the last period
(FOMAML) or the round's start (Reptile). Each reference is a numpy loop over the sampled clients
(three of six, three rounds) and their local steps, randomness taken from fljax's own sampling.
"""

import math

import jax
import numpy as np
import optax
import pytest

from fljax.algorithms import fedavg, fedsgd
from fljax.algorithms.feddecay import feddecay, local_decay
from fljax.algorithms.fedprox import fedprox
from fljax.algorithms.meta import fomaml, reptile
from fljax.errors import FljaxError
from tests.reference import global_norm, mlp_loss_and_grad, sgd_buffer, tree_map
from tests.test_drift_corrections import (EPOCHS, STEPS, assert_close, local_models, make_local,
                                          rounds_of, run, split)


def period_of(per, batch, n):
    return 1 if per == "step" else math.ceil(n / batch)


def beta_j(beta, schedule, j):
    if schedule == "linear_code":              # FederatedScope trainer_decay.py: 1 - beta * e
        return max(0.0, 1.0 - beta * j)
    return beta ** j if schedule == "exponential" else max(1.0 - j * (1.0 - beta), 0.0)


def shrunk_local(start, x, y, part, steps, *, period, coefficient, lr, momentum, weight_decay,
                 clip):
    """FederatedScope trainer_decay.py, epoch mode: torch SGD after clip_grad_norm_ at the full
    lr; at the end of period j (on_epoch_end, also after a partial last period) theta <- theta_p
    + coefficient(j) (theta - theta_p), theta_p saved at its start; the momentum buffer goes on."""
    theta, buf = tree_map(np.copy, start), None
    for k, (positions, mask) in enumerate(steps):
        if k % period == 0:
            theta_p = theta
        examples = part[np.minimum(positions, len(part) - 1)]
        _, g = mlp_loss_and_grad(theta, x[examples], y[examples], mask)
        buf = sgd_buffer(g, theta, buf, momentum=momentum, weight_decay=weight_decay, clip=clip)
        theta = tree_map(lambda a, b: a - lr * b, theta, buf)
        if (k + 1) % period == 0 or k == len(steps) - 1:
            b = coefficient(k // period)
            theta = tree_map(lambda a, s: s + b * (a - s), theta, theta_p)
    return theta


def feddecay_reference(params, x, y, parts, *, beta, schedule, per, mu, lr, lr_decay, momentum,
                       weight_decay, clip, server_lr, shrink=False, **sched):
    """w^{t+1} = w^t + eta_g sum_S p_i (y_i,K - w^t); local lr eta decay^t beta_j (or, with
    ``shrink``, each period's displacement scaled by beta_j); a proximal term
    mu/2 ||y - w^t||^2 in the local loss when mu > 0 (FedDecay over FedProx)."""
    w = params
    for t, clients in rounds_of(parts, **sched):
        delta = tree_map(np.zeros_like, w)
        for p, cid, steps in clients:
            period = period_of(per, sched["batch"], len(parts[cid]))
            anchor = w
            in_loss = (lambda v: tree_map(lambda a, b: mu * (a - b), v, anchor)) if mu else None
            if shrink:
                assert not mu
                end = shrunk_local(w, x, y, parts[cid], steps, period=period,
                                   coefficient=lambda j: beta_j(beta, schedule, j),
                                   lr=lr * lr_decay ** t, momentum=momentum,
                                   weight_decay=weight_decay, clip=clip)
            else:
                end = local_models(w, x, y, parts[cid], steps, lr=lr * lr_decay ** t,
                                   momentum=momentum, weight_decay=weight_decay, clip=clip,
                                   scale=lambda k: beta_j(beta, schedule, k // period),
                                   in_loss=in_loss)[-1]
            delta = tree_map(lambda d, a, b: d + p * (a - b), delta, end, w)
        w = tree_map(lambda a, d: a + server_lr * d, w, delta)
    return w


def meta_reference(params, x, y, parts, *, last_period, per, meta_step, lr, lr_decay, momentum,
                   weight_decay, clip, **sched):
    """w^{t+1} = w^t + eps_t sum_S p_i (y_i,K - y_i,p): p the start of the client's last period
    (FOMAML) or 0 (Reptile)."""
    w = params
    for t, clients in rounds_of(parts, **sched):
        delta = tree_map(np.zeros_like, w)
        for p, cid, steps in clients:
            models = local_models(w, x, y, parts[cid], steps, lr=lr * lr_decay ** t,
                                  momentum=momentum, weight_decay=weight_decay, clip=clip,
                                  scale=lambda k: 1.0)
            period = period_of(per, sched["batch"], len(parts[cid]))
            start = (len(steps) - 1) // period * period if last_period else 0
            delta = tree_map(lambda d, a, b: d + p * (a - b), delta, models[-1], models[start])
        w = tree_map(lambda a, d: a + meta_step(t) * d, w, delta)
    return w


def assert_bit_identical(got, expected):
    assert jax.tree.structure(got) == jax.tree.structure(expected)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
        np.testing.assert_array_equal(a, b)


MOMENTUM = dict(lr=0.3, lr_decay=0.9, momentum=0.6, weight_decay=1e-2, clip=None)
EPOCHS3 = dict(batch=5, local_steps=None, local_epochs=3)   # K_i = 3 ceil(n_i / 5): 3 to 9 steps

# ------------------------------------------------------------------------------------------------
# FedDecay

FEDDECAY_CASES = {
    "exponential_step_momentum": dict(**STEPS, **MOMENTUM, aggregation="examples",
                                      beta=0.5, schedule="exponential", per="step", mu=0.0,
                                      server_lr=1.0),
    "exponential_epoch_clip_uniform": dict(**EPOCHS3, lr=0.4, lr_decay=1.0, momentum=0.5,
                                           weight_decay=0.0, clip=0.5, aggregation="uniform",
                                           beta=0.3, schedule="exponential", per="epoch", mu=0.0,
                                           server_lr=0.8),
    # beta_j = 1, 0.6, 0.2, 0, 0: the max(., 0) is reached.
    "linear_step_momentum": dict(batch=4, local_steps=5, local_epochs=None, **MOMENTUM,
                                 aggregation="examples", beta=0.6, schedule="linear",
                                 per="step", mu=0.0, server_lr=1.0),
    # beta_j = 1, 0.4, 0 per epoch, over FedProx's local objective.
    "linear_epoch_momentum_fedprox": dict(**EPOCHS3, **MOMENTUM, aggregation="examples",
                                          beta=0.4, schedule="linear", per="epoch", mu=0.5,
                                          server_lr=1.0),
    # The official code's linear: beta_j = 1, 0.4, 0 per epoch (the paper's would be 1, 0.8, 0.6).
    "linear_code_epoch_clip": dict(**EPOCHS3, lr=0.4, lr_decay=0.9, momentum=0.5,
                                   weight_decay=1e-2, clip=0.5, aggregation="uniform", beta=0.6,
                                   schedule="linear_code", per="epoch", mu=0.0, server_lr=1.0),
    # The official code's epoch mode: each epoch at the full lr, then its displacement shrunk.
    "exponential_epoch_shrink_clip_momentum": dict(**EPOCHS3, lr=0.4, lr_decay=0.9, momentum=0.5,
                                                   weight_decay=1e-2, clip=0.5,
                                                   aggregation="uniform", beta=0.3,
                                                   schedule="exponential", per="epoch", mu=0.0,
                                                   server_lr=1.0, shrink=True),
    # K = 5 steps of batch 4: a partial last epoch (1 to 3 steps), shrunk at the last step.
    "linear_code_partial_epoch_shrink": dict(batch=4, local_steps=5, local_epochs=None,
                                             **MOMENTUM, aggregation="examples", beta=0.6,
                                             schedule="linear_code", per="epoch", mu=0.0,
                                             server_lr=0.8, shrink=True),
}


@pytest.mark.parametrize("case", sorted(FEDDECAY_CASES))
def test_feddecay_matches_float64_reference(case):
    local, sched, rest = split(FEDDECAY_CASES[case])
    decay = {k: rest[k] for k in ("beta", "schedule", "per") if k in rest}
    decay["shrink"] = rest.get("shrink", False)
    with jax.enable_x64(True):
        if rest["mu"]:
            assert not decay["shrink"]
            alg = local_decay(fedprox(make_local(**local), mu=rest["mu"],
                                      server_optimizer=optax.sgd(rest["server_lr"])), **decay)
        else:
            alg = feddecay(make_local(**local), **decay,
                           server_optimizer=optax.sgd(rest["server_lr"]))
        params, state, x, y, parts = run(alg, **sched)
    expected = feddecay_reference(params, x, y, parts, **local, **sched, **rest)
    assert_close(state.params, expected)
    # The decay mattered: the same run without it (every beta_j = 1) ends elsewhere.
    none = 0.0 if rest["schedule"] == "linear_code" else 1.0
    plain = feddecay_reference(params, x, y, parts, **local, **sched, **rest | dict(beta=none))
    assert global_norm(tree_map(np.subtract, plain, expected)) > 1e-3
    if rest["schedule"] == "linear_code":     # it is the paper's linear with 1 - beta
        with jax.enable_x64(True):
            paper = run(feddecay(make_local(**local), 1.0 - rest["beta"], "linear", rest["per"],
                                 optax.sgd(rest["server_lr"]), shrink=decay["shrink"]),
                        **sched)[1].params
        assert_close(paper, expected)
    if decay["shrink"]:                       # shrinking epochs is not decaying the lr in them
        by_lr = feddecay_reference(params, x, y, parts, **local, **sched,
                                   **rest | dict(shrink=False))
        assert global_norm(tree_map(np.subtract, by_lr, expected)) > 1e-3


def test_shrink_per_step_is_the_learning_rate_decay():
    """One step per period: shrinking the step's displacement by beta_j is scaling its lr."""
    local = dict(MOMENTUM, clip=0.5)
    with jax.enable_x64(True):
        runs = [run(feddecay(make_local(**local), 0.5, "exponential", per="step", shrink=shrink),
                    **STEPS, aggregation="examples")[1].params for shrink in (False, True)]
    assert_close(*runs)


REDUCTION = dict(aggregation="examples", **EPOCHS)
REDUCTION_LOCAL = make_local(0.4, 0.9, 0.5, 1e-2, 0.5)   # lr decay, momentum, wd, clip all on


def test_beta_one_is_fedavg_exactly():
    with jax.enable_x64(True):
        expected = run(fedavg(REDUCTION_LOCAL), **REDUCTION)[1].params
        for schedule, beta in (("exponential", 1.0), ("linear", 1.0), ("linear_code", 0.0)):
            got = run(feddecay(REDUCTION_LOCAL, beta, schedule, per="step"),
                      **REDUCTION)[1].params
            assert_bit_identical(got, expected)


@pytest.mark.parametrize("schedule", ["exponential", "linear"])
def test_beta_zero_per_step_is_one_local_step(schedule):
    """beta = 0 per step: the steps after the first do not move the model (FedSGD-like)."""
    sched = dict(batch=4, aggregation="examples", local_epochs=None)
    with jax.enable_x64(True):
        alg = feddecay(REDUCTION_LOCAL, 0.0, schedule, per="step")
        four_steps = run(alg, **sched, local_steps=4)[1].params
        two_steps = run(alg, **sched, local_steps=2)[1].params
        params, one_step, *_ = run(fedavg(REDUCTION_LOCAL), **sched, local_steps=1)
    assert_bit_identical(four_steps, two_steps)
    # XLA compiles a one-step local loop without the loop, so its float64 rounding differs (tens
    # of ulps over the rounds): equal to 1e-12, far below any effect of the steps.
    for a, b in zip(jax.tree.leaves(four_steps), jax.tree.leaves(one_step.params)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
    assert global_norm(tree_map(np.subtract, four_steps, params)) > 1e-2


@pytest.mark.parametrize("schedule", ["exponential", "linear"])
def test_beta_zero_on_the_full_local_batch_is_fedsgd(schedule):
    """beta = 0 per step with full-batch local steps: only the first step, a full-batch gradient
    step of lr, moves the model: FedSGD with the same lr (up to the order of the float ops)."""
    sched = dict(batch=None, local_epochs=None, local_steps=3, aggregation="examples")
    with jax.enable_x64(True):
        decayed = run(feddecay(make_local(0.3, 1.0, 0.0, 0.0, None), 0.0, schedule, per="step"),
                      **sched)[1].params
        fedsgd_params = run(fedsgd(0.3), **{**sched, "local_steps": 1})[1].params
    assert_close(decayed, fedsgd_params)


# ------------------------------------------------------------------------------------------------
# FOMAML and Reptile

META_CASES = {
    "fomaml_step_momentum": dict(**STEPS, **MOMENTUM, aggregation="examples", algorithm="fomaml",
                                 per="step", meta_step=0.7),
    # K = 5 steps of batch 4: the last local epoch is partial (steps 4 or 3..4); clients vmapped.
    "fomaml_epoch_partial_vmap": dict(batch=4, local_steps=5, local_epochs=None, **MOMENTUM,
                                      aggregation="examples", algorithm="fomaml", per="epoch",
                                      meta_step=0.7, client_chunk=3),
    "fomaml_epoch_clip_uniform": dict(**EPOCHS, lr=0.4, lr_decay=1.0, momentum=0.5,
                                      weight_decay=1e-3, clip=0.5, aggregation="uniform",
                                      algorithm="fomaml", per="epoch", meta_step=1.0),
    "reptile_annealed_uniform": dict(**EPOCHS, **MOMENTUM, aggregation="uniform",
                                     algorithm="reptile", per="step", meta_step="annealed"),
}


@pytest.mark.parametrize("case", sorted(META_CASES))
def test_meta_learning_matches_float64_reference(case):
    local, sched, rest = split(META_CASES[case])
    if rest["meta_step"] == "annealed":   # eps_t from 1 to 0.2 over 3 rounds (Reptile's code)
        meta_step = schedule = lambda t: 1.0 - 0.8 * t / 3   # optax's schedules are float32
    else:
        meta_step, schedule = (lambda t: rest["meta_step"]), rest["meta_step"]
    with jax.enable_x64(True):
        if rest["algorithm"] == "fomaml":
            alg = fomaml(make_local(**local), schedule, per=rest["per"])
        else:
            alg = reptile(make_local(**local), schedule)
        params, state, x, y, parts = run(alg, **sched, client_chunk=rest.get("client_chunk", 1))
    last_period = rest["algorithm"] == "fomaml"
    expected = meta_reference(params, x, y, parts, last_period=last_period, per=rest["per"],
                              meta_step=meta_step, **local, **sched)
    assert_close(state.params, expected)
    # FOMAML's message is not Reptile's: only the last period counted.
    other = meta_reference(params, x, y, parts, last_period=not last_period, per=rest["per"],
                           meta_step=meta_step, **local, **sched)
    assert global_norm(tree_map(np.subtract, other, expected)) > 1e-3


# ------------------------------------------------------------------------------------------------
# bad hyperparameters

@pytest.mark.parametrize("kwargs, match", [
    (dict(beta=-0.1), r"beta .* \[0, 1\], got -0.1"),
    (dict(beta=1.5), r"beta .* \[0, 1\], got 1.5"),
    (dict(beta=float("nan")), r"beta .* got nan"),
    (dict(beta="0.5"), r"beta .* got '0.5'"),
    (dict(beta=0.5, schedule="cosine"), r"schedule must be one of \('exponential', 'linear', "
                                        r"'linear_code'\), got 'cosine'"),
    (dict(beta=0.5, per="batch"), r"per must be one of \('step', 'epoch'\), got 'batch'"),
])
def test_bad_decay_raises(kwargs, match):
    with pytest.raises(FljaxError, match=match):
        local_decay(fedavg(REDUCTION_LOCAL), **kwargs)


@pytest.mark.parametrize("make, match", [
    (lambda: reptile(REDUCTION_LOCAL, 0.0), r"meta_step_size must be > 0 .* got 0.0"),
    (lambda: fomaml(REDUCTION_LOCAL, float("inf")), r"meta_step_size .* got inf"),
    (lambda: fomaml(REDUCTION_LOCAL, per="round"), r"per must be one of .* got 'round'"),
])
def test_bad_meta_hyperparameters_raise(make, match):
    with pytest.raises(FljaxError, match=match):
        make()
