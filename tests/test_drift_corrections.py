"""FedProx, SCAFFOLD and FedDyn equal float64 references written from their papers / official code.

Each reference is a numpy loop over the sampled clients and their local steps (randomness taken
from fljax's own sampling via ``client_schedule``), with every update rule written out as the
paper (SCAFFOLD, FedProx) or the official FedDyn code states it: FedDyn keeps every client's h_k
and averages all N of them, as the official code does (fljax keeps a running mean instead).
Clipping covers the loss gradient plus the in-loss terms; weight decay (and FedDyn's alpha_k) is
added after clipping.
"""

import functools

import jax
import numpy as np
import optax
import pytest

from fljax.algorithms import fedavg, local_sgd
from fljax.algorithms.feddyn import feddyn
from fljax.algorithms.fedprox import fedprox
from fljax.algorithms.scaffold import scaffold
from fljax.data.federated import federate
from fljax.core.engine import init_state, make_round
from fljax.errors import FljaxError
from tests.reference import (client_schedule, cohort_full_gradients, global_norm,
                             mlp_loss_and_grad, sgd_buffer, tree_map)
from tests.test_fedavg_reference import NUM_CLASSES, SIZES, tiny_problem

ROUNDS, COHORT, SEED = 3, 3, 3


# ------------------------------------------------------------------------------------------------
# float64 reference pieces

def zeros(tree):
    return tree_map(np.zeros_like, tree)


def local_models(start, x, y, part, steps, *, lr, momentum, weight_decay, clip, in_loss=None,
                 scale=lambda k: 1.0):
    """[y_0, ..., y_K] of torch SGD after clip_grad_norm_ with the learning rate lr * scale(k) on
    the loss (+ in-loss terms):
    d = clip(grad CE(y) + in_loss(y)) + weight_decay * y;  buf = momentum * buf + d;
    y -= lr * scale(k) * buf."""
    models = [tree_map(np.copy, start)]
    buf = None
    for k, (positions, mask) in enumerate(steps):
        local = models[-1]
        examples = part[np.minimum(positions, len(part) - 1)]
        _, g = mlp_loss_and_grad(local, x[examples], y[examples], mask)
        if in_loss is not None:
            g = tree_map(np.add, g, in_loss(local))
        buf = sgd_buffer(g, local, buf, momentum=momentum, weight_decay=weight_decay, clip=clip)
        models.append(tree_map(lambda a, b: a - lr * scale(k) * b, local, buf))
    return models


def local_train(start, x, y, part, steps, **kwargs):
    """The local model after the K steps of ``local_models``."""
    return local_models(start, x, y, part, steps, **kwargs)[-1]


@functools.lru_cache(maxsize=None)
def schedule(sizes, t, cohort, batch, local_steps, local_epochs, seed, participation="uniform"):
    """Round t's [(client id, steps)] exactly as fljax samples them (under x64, as the fljax runs
    here are: the sampling draws depend on it)."""
    counts = np.array(sizes)
    with jax.enable_x64(True):
        return list(client_schedule(jax.random.PRNGKey(seed), t, cohort, counts, batch,
                                    local_steps, local_epochs, counts.max(), participation))


def rounds_of(parts, *, batch, local_steps, local_epochs, aggregation, cohort=COHORT, seed=SEED,
              rounds=ROUNDS, participation="uniform"):
    """Per round: (t, [(p_i, client id, steps)]); p_i over the clients of the round."""
    sizes = tuple(len(p) for p in parts)
    counts = np.array(sizes)
    for t in range(rounds):
        clients = schedule(sizes, t, cohort, batch, local_steps, local_epochs, seed,
                           participation)
        ids = [cid for cid, _ in clients]
        p = (counts[ids] / counts[ids].sum() if aggregation == "examples"
             else np.full(len(ids), 1.0 / len(ids)))
        yield t, [(pi, cid, steps) for pi, (cid, steps) in zip(p, clients)]


def fedprox_reference(params, x, y, parts, *, mu, lr, lr_decay, momentum, weight_decay, clip,
                      server_lr, **sched):
    """w^{t+1} = w^t + eta_g sum_S p_k (y_k - w^t); local loss F_k(y) + mu/2 ||y - w^t||^2."""
    w = params
    for t, clients in rounds_of(parts, **sched):
        delta = zeros(w)
        for p, cid, steps in clients:
            anchor = w
            local = local_train(w, x, y, parts[cid], steps, lr=lr * lr_decay ** t,
                                momentum=momentum, weight_decay=weight_decay, clip=clip,
                                in_loss=lambda v: tree_map(lambda a, b: mu * (a - b), v, anchor))
            delta = tree_map(lambda d, a, b: d + p * (a - b), delta, local, w)
        w = tree_map(lambda a, d: a + server_lr * d, w, delta)
    return w


def scaffold_reference(params, x, y, parts, *, option, undecayed_lr, lr, lr_decay, momentum,
                       weight_decay, clip, server_lr, **sched):
    """Karimireddy et al. Algorithm 1: local g - c_i + c; option I c_i+ = g_i(x), option II
    c_i+ = c_i - c + (x - y_i)/(K_i eta_l); x += eta_g sum_S p_i (y_i - x); c += 1/N sum_S dc_i."""
    n_clients = len(parts)
    w, c = params, zeros(params)
    cs = [zeros(params) for _ in range(n_clients)]
    for t, clients in rounds_of(parts, **sched):
        lr_t = lr * lr_decay ** t
        delta, delta_c, updated = zeros(w), zeros(w), {}
        for p, cid, steps in clients:
            correction = tree_map(lambda a, b: a - b, c, cs[cid])
            local = local_train(w, x, y, parts[cid], steps, lr=lr_t, momentum=momentum,
                                weight_decay=weight_decay, clip=clip,
                                in_loss=lambda v: correction)
            if option == "I":
                part = parts[cid]
                _, c_new = mlp_loss_and_grad(w, x[part], y[part], np.ones(len(part)))
            else:
                eta = lr if undecayed_lr else lr_t
                c_new = tree_map(lambda ci, cc, a, b: ci - cc + (a - b) / (len(steps) * eta),
                                 cs[cid], c, w, local)
            delta = tree_map(lambda d, a, b: d + p * (a - b), delta, local, w)
            delta_c = tree_map(lambda d, a, b: d + (a - b) / n_clients, delta_c, c_new, cs[cid])
            updated[cid] = c_new
        w = tree_map(lambda a, d: a + server_lr * d, w, delta)
        c = tree_map(np.add, c, delta_c)
        for cid, c_new in updated.items():
            cs[cid] = c_new
    return w, c, cs


def feddyn_reference(params, x, y, parts, *, alpha, adaptive_alpha, client_regularization,
                     server_correction, lr, lr_decay, momentum, weight_decay, clip, **sched):
    """The official code: alpha_k = alpha / (n_k / sum(n) * N); loss CE + alpha_k <y, h_k - theta>,
    SGD weight decay wd + alpha_k; h_k += y_k - theta; theta = mean_S y_k + mean over ALL N h_k.
    ``client_regularization`` and ``server_correction`` are booleans, or functions of the round t
    (a variant switched mid-run that keeps every h_k)."""
    per_round = lambda flag: flag if callable(flag) else (lambda t: flag)
    regularized, corrected = per_round(client_regularization), per_round(server_correction)
    counts = np.array([len(p) for p in parts], np.float64)
    n_clients = len(parts)
    weight_list = counts / counts.sum() * n_clients
    alphas = alpha / weight_list if adaptive_alpha else np.full(n_clients, alpha)
    theta, gamma = params, params
    hs = [zeros(params) for _ in range(n_clients)]
    for t, clients in rounds_of(parts, **sched):
        gamma = zeros(theta)
        for p, cid, steps in clients:
            a_k, h_k, server = alphas[cid], hs[cid], theta
            if regularized(t):
                in_loss = lambda v: tree_map(lambda h, s: a_k * (h - s), h_k, server)
                decay = weight_decay + a_k
            else:
                in_loss, decay = None, weight_decay
            local = local_train(theta, x, y, parts[cid], steps, lr=lr * lr_decay ** t,
                                momentum=momentum, weight_decay=decay, clip=clip, in_loss=in_loss)
            hs[cid] = tree_map(lambda h, a, b: h + (a - b), h_k, local, server)
            gamma = tree_map(lambda g, a: g + p * a, gamma, local)
        h_all = tree_map(lambda *leaves: sum(leaves) / n_clients, *hs)
        theta = tree_map(np.add, gamma, h_all) if corrected(t) else gamma
    return theta, gamma, hs


# ------------------------------------------------------------------------------------------------
# running fljax in float64

def run(alg, *, batch, local_steps, local_epochs, aggregation, cohort=COHORT, seed=SEED,
        rounds=ROUNDS, problem_seed=0, client_chunk=1, participation="uniform"):
    """(initial float64 params, final state, x, y, parts); call inside jax.enable_x64(True)."""
    x, y, parts, model = tiny_problem(problem_seed)
    params = jax.tree.map(lambda a: np.asarray(a, np.float64), model.init(jax.random.PRNGKey(1)))
    round_fn = make_round(alg, model, federate(x, y, parts, NUM_CLASSES),
                          clients_per_round=cohort, batch_size=batch, local_steps=local_steps,
                          local_epochs=local_epochs, aggregation=aggregation,
                          client_chunk=client_chunk, participation=participation)
    state = init_state(alg, params, len(parts), seed=seed)
    for _ in range(rounds):
        state, _ = round_fn(state)
    return params, jax.tree.map(np.asarray, state), x, y, parts


def assert_close(got, expected, rtol=1e-12, atol=1e-13):
    assert jax.tree.structure(got) == jax.tree.structure(expected)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
        assert a.dtype == np.float64
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


def client_row(stacked, cid):
    return jax.tree.map(lambda a: a[cid], stacked)


def split(case):
    """(local SGD kwargs, schedule kwargs, the rest) of a test case."""
    local = {k: case[k] for k in ("lr", "lr_decay", "momentum", "weight_decay", "clip")}
    sched = {k: case[k] for k in ("batch", "local_steps", "local_epochs", "aggregation")}
    rest = {k: v for k, v in case.items() if k not in local and k not in sched}
    return local, sched, rest


def make_local(lr, lr_decay, momentum, weight_decay, clip):
    return local_sgd(lr, round_decay=lr_decay, momentum=momentum, weight_decay=weight_decay,
                     clip_norm=clip)


STEPS = dict(batch=4, local_steps=3, local_epochs=None)
EPOCHS = dict(batch=5, local_steps=None, local_epochs=2)  # uneven K_i = 2 ceil(n_i / 5)
PLAIN = dict(lr=0.3, lr_decay=1.0, momentum=0.0, weight_decay=0.0, clip=None)


# ------------------------------------------------------------------------------------------------
# FedProx

FEDPROX_CASES = {
    "steps_momentum_weight_decay": dict(**STEPS, **PLAIN | dict(momentum=0.6, weight_decay=1e-2),
                                        aggregation="examples", mu=0.7, server_lr=1.0),
    "epochs_clip_decay_uniform": dict(**EPOCHS, lr=0.5, lr_decay=0.9, momentum=0.0,
                                      weight_decay=1e-2, clip=0.5, aggregation="uniform", mu=0.4,
                                      server_lr=0.8),
}


@pytest.mark.parametrize("case", sorted(FEDPROX_CASES))
def test_fedprox_matches_float64_reference(case):
    local, sched, rest = split(FEDPROX_CASES[case])
    with jax.enable_x64(True):
        alg = fedprox(make_local(**local), mu=rest["mu"],
                      server_optimizer=optax.sgd(rest["server_lr"]))
        params, state, x, y, parts = run(alg, **sched)
    expected = fedprox_reference(params, x, y, parts, **local, **sched, **rest)
    assert_close(state.params, expected)
    # The proximal term mattered: the same run without it ends elsewhere.
    plain = fedprox_reference(params, x, y, parts, **local, **sched, **rest | dict(mu=0.0))
    assert global_norm(tree_map(np.subtract, plain, expected)) > 1e-3


# The published reductions are checked against fljax's FedAvg with this local optimizer (momentum,
# weight decay, clipping and lr decay all on) and uneven numbers of local steps.
REDUCTION_LOCAL = make_local(0.4, 0.9, 0.5, 1e-2, 0.5)


@functools.lru_cache(maxsize=None)
def fedavg_params(aggregation):
    with jax.enable_x64(True):
        return run(fedavg(REDUCTION_LOCAL), **EPOCHS, aggregation=aggregation)[1].params


def assert_equal_to_fedavg(params, aggregation):
    expected = fedavg_params(aggregation)
    assert jax.tree.structure(params) == jax.tree.structure(expected)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(expected)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("aggregation", ["uniform", "examples"])
def test_fedprox_with_mu_zero_is_fedavg_exactly(aggregation):
    with jax.enable_x64(True):
        _, state, *_ = run(fedprox(REDUCTION_LOCAL, mu=0.0), **EPOCHS, aggregation=aggregation)
    assert_equal_to_fedavg(state.params, aggregation)


# ------------------------------------------------------------------------------------------------
# SCAFFOLD

SCAFFOLD_CASES = {
    "II_current_lr": dict(**STEPS, **PLAIN | dict(lr_decay=0.7, weight_decay=1e-2),
                          aggregation="examples", option="II", undecayed_lr=False, server_lr=1.0),
    "II_base_lr": dict(**STEPS, **PLAIN | dict(lr_decay=0.7, weight_decay=1e-2),
                       aggregation="examples", option="II", undecayed_lr=True, server_lr=1.0),
    "II_epochs_clip_momentum_uniform": dict(**EPOCHS, lr=0.3, lr_decay=0.9, momentum=0.5,
                                            weight_decay=1e-3, clip=0.5, aggregation="uniform",
                                            option="II", undecayed_lr=False, server_lr=0.8),
    "I_epochs_clip": dict(**EPOCHS, lr=0.3, lr_decay=0.9, momentum=0.0, weight_decay=1e-2,
                          clip=0.5, aggregation="examples", option="I", undecayed_lr=False,
                          server_lr=1.3),
}


@functools.lru_cache(maxsize=None)
def run_scaffold(case, client_chunk=1):
    local, sched, rest = split(SCAFFOLD_CASES[case])
    with jax.enable_x64(True):
        alg = scaffold(make_local(**local), server_lr=rest["server_lr"], option=rest["option"],
                       undecayed_lr=rest["undecayed_lr"])
        params, state, x, y, parts = run(alg, **sched, client_chunk=client_chunk)
    expected = scaffold_reference(params, x, y, parts, **local, **sched, **rest)
    return params, state, expected


@pytest.mark.parametrize("case", sorted(SCAFFOLD_CASES))
def test_scaffold_matches_float64_reference(case):
    params, state, (w, c, cs) = run_scaffold(case)
    assert_close(state.params, w)
    assert_close(state.server_state, c)
    for cid, ci in enumerate(cs):
        assert_close(client_row(state.client_states, cid), ci)
    # c = c^0 + 1/N sum of all changes telescopes to the mean of ALL the c_i (partial
    # participation included).
    assert_close(state.server_state, tree_map(lambda *a: sum(a) / len(cs), *cs))
    assert global_norm(c) > 1e-3
    assert global_norm(tree_map(np.subtract, w, params)) > 1e-2


def test_scaffold_vmapped_clients_match_sequential():
    _, seq, _ = run_scaffold("II_epochs_clip_momentum_uniform", client_chunk=1)
    _, vec, _ = run_scaffold("II_epochs_clip_momentum_uniform", client_chunk=3)
    assert_close(vec.params, seq.params)
    assert_close(vec.client_states, seq.client_states)


def test_scaffold_base_lr_and_current_lr_differ_when_the_lr_decays():
    _, current, _ = run_scaffold("II_current_lr")
    _, base, _ = run_scaffold("II_base_lr")
    assert global_norm(tree_map(np.subtract, current.server_state, base.server_state)) > 1e-3


def test_scaffold_full_participation_makes_c_the_mean_of_the_client_variates():
    with jax.enable_x64(True):
        alg = scaffold(make_local(0.3, 0.9, 0.0, 1e-2, 1.0))
        _, state, *_ = run(alg, **STEPS, aggregation="uniform", cohort=len(SIZES), rounds=1)
    mean_ci = jax.tree.map(lambda a: a.mean(axis=0), state.client_states)
    assert_close(state.server_state, mean_ci)
    assert global_norm(mean_ci) > 1e-3


def scaffold_ga_reference(params, x, y, parts, *, lr, lr_decay, momentum, weight_decay, clip,
                          server_lr, **sched):
    """The GradientAlignment code's Scaffold: every round the sampled clients' full gradients at x,
    gbar = sum_S n_i g_i(x) / sum_S n_i; each local step on clip(g(y) + gbar - g_i(x)) + wd y;
    x += eta_g sum_S p_i (y_i - x). No state across rounds."""
    w = params
    for t, clients in rounds_of(parts, **sched):
        grads, gbar = cohort_full_gradients(w, x, y, parts, [cid for _, cid, _ in clients])
        delta = zeros(w)
        for p, cid, steps in clients:
            correction = tree_map(np.subtract, gbar, grads[cid])
            local = local_train(w, x, y, parts[cid], steps, lr=lr * lr_decay ** t,
                                momentum=momentum, weight_decay=weight_decay, clip=clip,
                                in_loss=lambda v: correction)
            delta = tree_map(lambda d, a, b: d + p * (a - b), delta, local, w)
        w = tree_map(lambda a, d: a + server_lr * d, w, delta)
    return w


@pytest.mark.parametrize("client_chunk", [1, 3])
def test_scaffold_ga_option_matches_the_gradient_alignment_code(client_chunk):
    local = dict(lr=0.3, lr_decay=0.9, momentum=0.5, weight_decay=1e-2, clip=0.5)
    sched = dict(**EPOCHS, aggregation="uniform")     # uneven clients, as the GA code averages
    with jax.enable_x64(True):
        alg = scaffold(make_local(**local), server_lr=0.8, option="GA")
        params, state, x, y, parts = run(alg, **sched, client_chunk=client_chunk)
    w = scaffold_ga_reference(params, x, y, parts, server_lr=0.8, **local, **sched)
    assert_close(state.params, w)
    assert state.server_state == () and state.client_states == ()
    assert [alg.exchanges(t) for t in range(3)] == [2, 2, 2] and alg.payload(0) == (2, 2)
    # The fresh correction mattered: plain FedAvg (same server step) and option II end elsewhere.
    fedavg_like = fedprox_reference(params, x, y, parts, mu=0.0, server_lr=0.8, **local, **sched)
    option_ii = scaffold_reference(params, x, y, parts, option="II", undecayed_lr=False,
                                   server_lr=0.8, **local, **sched)[0]
    for other in (fedavg_like, option_ii):
        assert global_norm(tree_map(np.subtract, other, w)) > 1e-3


# ------------------------------------------------------------------------------------------------
# FedDyn

FEDDYN_CASES = {
    "adaptive_uniform_clip": dict(**STEPS, lr=0.3, lr_decay=1.0, momentum=0.0, weight_decay=1e-3,
                                  clip=0.5, aggregation="uniform", alpha=0.3, adaptive_alpha=True,
                                  client_regularization=True, server_correction=True),
    "adaptive_weighted_epochs_decay": dict(**EPOCHS, lr=0.2, lr_decay=0.9, momentum=0.0,
                                           weight_decay=1e-2, clip=None, aggregation="examples",
                                           alpha=0.5, adaptive_alpha=True,
                                           client_regularization=True, server_correction=True),
    "fixed_alpha_momentum": dict(**STEPS, **PLAIN | dict(momentum=0.5, lr=0.2),
                                 aggregation="uniform", alpha=0.3, adaptive_alpha=False,
                                 client_regularization=True, server_correction=True),
    "without_reg": dict(**EPOCHS, lr=0.3, lr_decay=1.0, momentum=0.0, weight_decay=1e-2,
                        clip=0.5, aggregation="uniform", alpha=0.3, adaptive_alpha=True,
                        client_regularization=False, server_correction=True),
    "without_h": dict(**STEPS, lr=0.3, lr_decay=0.9, momentum=0.0, weight_decay=1e-2, clip=0.5,
                      aggregation="uniform", alpha=0.3, adaptive_alpha=True,
                      client_regularization=True, server_correction=False),
}


def feddyn_of(local, rest):
    return feddyn(make_local(**local), alpha=rest["alpha"], adaptive_alpha=rest["adaptive_alpha"],
                  client_regularization=rest["client_regularization"],
                  server_correction=rest["server_correction"])


@pytest.mark.parametrize("case", sorted(FEDDYN_CASES))
def test_feddyn_matches_float64_reference(case):
    local, sched, rest = split(FEDDYN_CASES[case])
    with jax.enable_x64(True):
        alg = feddyn_of(local, rest)
        params, state, x, y, parts = run(alg, **sched)
        models = alg.eval_models(state.params, state.server_state)
    theta, gamma, hs = feddyn_reference(params, x, y, parts, **local, **sched, **rest)
    assert list(models) == ["global", "gamma"]  # "global" first
    assert_close(state.params, theta)
    assert_close(models["global"], theta)
    assert_close(models["gamma"], gamma)
    for cid, h in enumerate(hs):
        assert_close(client_row(state.client_states, cid), h)
    # The server's running mean of h is the mean over ALL clients, never-sampled ones as 0.
    assert_close(state.server_state.h_mean, tree_map(lambda *a: sum(a) / len(hs), *hs))
    if rest["server_correction"]:
        assert global_norm(tree_map(np.subtract, theta, gamma)) > 1e-3
    else:
        assert_close(models["gamma"], theta)
    # The case is sensitive to what it varies: FedDyn with both parts on and alpha_k adaptive
    # switched ends elsewhere (alpha_k differs between the uneven clients).
    full = feddyn_reference(params, x, y, parts, **local, **sched,
                            **rest | dict(client_regularization=True, server_correction=True,
                                          adaptive_alpha=not rest["adaptive_alpha"]))[0]
    assert global_norm(tree_map(np.subtract, full, theta)) > 1e-3


@pytest.mark.parametrize("aggregation", ["uniform", "examples"])
def test_feddyn_without_reg_and_h_is_fedavg_exactly(aggregation):
    with jax.enable_x64(True):
        dyn = feddyn(REDUCTION_LOCAL, alpha=0.3, client_regularization=False,
                     server_correction=False)
        _, state, *_ = run(dyn, **EPOCHS, aggregation=aggregation)
    assert_equal_to_fedavg(state.params, aggregation)


def test_feddyn_default_adaptive_alpha_needs_nothing_but_the_local_optimizer():
    """The official default (adaptive alpha) takes every n_k from the engine: feddyn(local)
    equals the float64 reference whose alpha_k = alpha / (n_k / mean n) uses the data's sizes."""
    local, sched, rest = split(FEDDYN_CASES["adaptive_uniform_clip"])
    with jax.enable_x64(True):
        alg = feddyn(make_local(**local), alpha=rest["alpha"])
        params, state, x, y, parts = run(alg, **sched)
    assert_close(state.params, feddyn_reference(params, x, y, parts, **local, **sched, **rest)[0])


# ------------------------------------------------------------------------------------------------
# bad hyperparameters

LOCAL = local_sgd(0.1)
BAD = {
    "fedprox_negative_mu": (lambda: fedprox(LOCAL, mu=-1.0), "mu must be >= 0"),
    "fedprox_nan_mu": (lambda: fedprox(LOCAL, mu=float("nan")), "mu must be >= 0"),
    "fedprox_optax_local": (lambda: fedprox(optax.sgd(0.1)), "LocalSGD"),
    "scaffold_zero_server_lr": (lambda: scaffold(LOCAL, server_lr=0.0), "server_lr must be > 0"),
    "scaffold_negative_server_lr": (lambda: scaffold(LOCAL, server_lr=-1.0),
                                    "server_lr must be > 0"),
    "scaffold_unknown_option": (lambda: scaffold(LOCAL, option="III"), "option must be one of"),
    "scaffold_int_option": (lambda: scaffold(LOCAL, option=2), "option must be one of"),
    "scaffold_optax_local": (lambda: scaffold(optax.sgd(0.1)), "LocalSGD"),
    "feddyn_zero_alpha": (lambda: feddyn(LOCAL, alpha=0.0), "alpha must be > 0"),
    "feddyn_negative_alpha": (lambda: feddyn(LOCAL, alpha=-0.01, adaptive_alpha=False),
                              "alpha must be > 0"),
    "feddyn_inf_alpha": (lambda: feddyn(LOCAL, alpha=float("inf"), adaptive_alpha=False),
                         "alpha must be > 0"),
    "feddyn_optax_local": (lambda: feddyn(optax.sgd(0.1), adaptive_alpha=False), "LocalSGD"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_hyperparameters_are_rejected(case):
    build, message = BAD[case]
    with pytest.raises(FljaxError, match=message):
        build()


def test_defaults_and_names():
    assert fedprox(LOCAL).name == "fedprox"
    assert scaffold(LOCAL).name == "scaffold"
    assert feddyn(LOCAL).name == "feddyn"
    assert feddyn(LOCAL, adaptive_alpha=False).name == "feddyn"
