"""FedInit (+RI), FedGA and large-batch SGD equal float64 references written from their equations.

FedInit (Sun, Shen and Tao, NeurIPS 2023; Algorithm 1; FL-Simulator's RI): w_i,0 = w + beta (w -
w_i,K^{prev}) with w_i,K^{prev} = w^0 for clients never sampled; aggregated relative to the relaxed
start (w += sum_S p_i (w_i,K - w_i,0)) or as the average of the final models (w = sum_S p_i w_i,K).
+RI on SCAFFOLD as FL-Simulator codes it: c_i updated with (w_i,0 - w_i,K), the model with w_i,K -
w_i,0. FedGA (Dandi, Barba and Jaggi, AAAI 2022; Algorithm 2, official code): gbar = sum_S n_i
g_i(x) / sum_S n_i, x_i,0 = x - beta (gbar - g_i(x)), K local steps, FedAvg. Partial participation
(3 of 6 uneven clients), 3 rounds, randomness from fljax's own sampling (tests/reference.py).
"""

import jax
import numpy as np
import pytest

from fljax.algorithms import fedavg, fedsgd, local_sgd, scaffold
from fljax.algorithms.fedga import fedga, gradalign, lbsgd
from fljax.algorithms.feddyn import feddyn
from fljax.algorithms.fedinit import fedinit, relaxed_init
from fljax.data.federated import federate
from fljax.core.engine import init_state, make_round, round_key, sample_cohort
from fljax.errors import FljaxError
from tests.reference import cohort_full_gradients, global_norm, mlp_loss_and_grad, tree_map
from tests.test_drift_corrections import (EPOCHS, REDUCTION_LOCAL, STEPS, assert_close,
                                          assert_equal_to_fedavg, client_row, local_train,
                                          make_local, rounds_of, zeros)
from tests.test_fedavg_reference import NUM_CLASSES, SIZES, tiny_problem

SEED = 3
LOCAL = dict(lr=0.3, lr_decay=0.9, momentum=0.5, weight_decay=1e-2, clip=0.5)


def run(alg, *, batch, local_steps, local_epochs, aggregation, cohort=3, rounds=3,
        client_chunk=1):
    """(initial float64 params, final state, per-round metrics, x, y, parts); under x64."""
    x, y, parts, model = tiny_problem(0)
    with jax.enable_x64(True):
        params = jax.tree.map(lambda a: np.asarray(a, np.float64),
                              model.init(jax.random.PRNGKey(1)))
        round_fn = make_round(alg, model, federate(x, y, parts, NUM_CLASSES),
                              clients_per_round=cohort, batch_size=batch,
                              local_steps=local_steps, local_epochs=local_epochs,
                              aggregation=aggregation, client_chunk=client_chunk)
        state = init_state(alg, params, len(parts), seed=SEED)
        metrics = []
        for _ in range(rounds):
            state, m = round_fn(state)
            metrics.append(jax.tree.map(np.asarray, m))
        state = jax.tree.map(np.asarray, state)
    return params, state, metrics, x, y, parts


def sq_norm(tree):
    return sum(float(np.sum(leaf ** 2)) for leaf in jax.tree.leaves(tree))


# ------------------------------------------------------------------------------------------------
# FedInit and +RI

def fedinit_reference(params, x, y, parts, *, beta, aggregate, lr, lr_decay, momentum,
                      weight_decay, clip, **sched):
    """Algorithm 1 with FedAvg (server sgd(1)); returns (w, last models, divergence per round)."""
    w = params
    lasts = [params] * len(parts)
    divergence = []
    for t, clients in rounds_of(parts, seed=SEED, **sched):
        new_w = zeros(w) if aggregate == "final" else w
        div = 0.0
        for p, cid, steps in clients:
            div += sq_norm(tree_map(np.subtract, lasts[cid], w)) / len(clients)
            start = tree_map(lambda a, b: a + beta * (a - b), w, lasts[cid])
            local = local_train(start, x, y, parts[cid], steps, lr=lr * lr_decay ** t,
                                momentum=momentum, weight_decay=weight_decay, clip=clip)
            if aggregate == "final":
                new_w = tree_map(lambda s, a: s + p * a, new_w, local)
            else:
                new_w = tree_map(lambda s, a, b: s + p * (a - b), new_w, local, start)
            lasts[cid] = local
        w = new_w
        divergence.append(div)
    return w, lasts, divergence


@pytest.mark.parametrize("aggregate,aggregation", [("start", "uniform"), ("final", "examples")])
def test_fedinit_matches_float64_reference(aggregate, aggregation):
    sched = dict(**EPOCHS, aggregation=aggregation)   # uneven K_i
    with jax.enable_x64(True):
        alg = fedinit(make_local(**LOCAL), beta=0.3, aggregate=aggregate)
    params, state, metrics, x, y, parts = run(alg, **sched)
    w, lasts, divergence = fedinit_reference(params, x, y, parts, beta=0.3, aggregate=aggregate,
                                             **LOCAL, **sched)
    assert_close(state.params, w)
    for cid, last in enumerate(lasts):
        assert_close(client_row(state.client_states.last_model, cid), last)
    # Some client was never sampled (its last model is still w^0), some were sampled twice.
    sampled = [set(m["clients"].tolist()) for m in metrics]
    assert set(range(len(SIZES))) - set.union(*sampled)
    assert any(len(a & b) for a in sampled for b in sampled if a is not b)
    assert all(set(m["clients"].tolist()) == s for m, s in zip(metrics, sampled))
    np.testing.assert_allclose([float(m["divergence"]) for m in metrics], divergence,
                               rtol=1e-12, atol=0)
    assert divergence[0] == 0.0 and min(divergence[1:]) > 1e-3
    # beta mattered, and so does the choice of aggregation.
    for other in (dict(beta=0.0, aggregate=aggregate),
                  dict(beta=0.3, aggregate="final" if aggregate == "start" else "start")):
        moved = fedinit_reference(params, x, y, parts, **other, **LOCAL, **sched)[0]
        assert global_norm(tree_map(np.subtract, moved, w)) > 1e-3


def scaffold_ri_reference(params, x, y, parts, *, beta, lr, lr_decay, momentum, weight_decay,
                          clip, server_lr, **sched):
    """FL-Simulator SCAFFOLD with --use-RI: start_i = w + beta (w - last_i); local g - c_i + c;
    c_i+ = c_i - c + (start_i - y_i)/(K_i eta); w += eta_g sum_S p_i (y_i - start_i);
    c += 1/N sum_S (c_i+ - c_i)."""
    n_clients = len(parts)
    w, c = params, zeros(params)
    cs = [zeros(params) for _ in range(n_clients)]
    lasts = [params] * n_clients
    for t, clients in rounds_of(parts, seed=SEED, **sched):
        lr_t = lr * lr_decay ** t
        delta, delta_c, updated = zeros(w), zeros(w), {}
        for p, cid, steps in clients:
            start = tree_map(lambda a, b: a + beta * (a - b), w, lasts[cid])
            correction = tree_map(np.subtract, c, cs[cid])
            local = local_train(start, x, y, parts[cid], steps, lr=lr_t, momentum=momentum,
                                weight_decay=weight_decay, clip=clip,
                                in_loss=lambda v: correction)
            c_new = tree_map(lambda ci, cc, a, b: ci - cc + (a - b) / (len(steps) * lr_t),
                             cs[cid], c, start, local)
            delta = tree_map(lambda d, a, b: d + p * (a - b), delta, local, start)
            delta_c = tree_map(lambda d, a, b: d + (a - b) / n_clients, delta_c, c_new, cs[cid])
            updated[cid] = c_new
            lasts[cid] = local
        w = tree_map(lambda a, d: a + server_lr * d, w, delta)
        c = tree_map(np.add, c, delta_c)
        for cid, c_new in updated.items():
            cs[cid] = c_new
    return w, c, cs, lasts


def test_scaffold_with_relaxed_init_matches_the_fl_simulator_rule():
    sched = dict(**STEPS, aggregation="uniform")
    local = dict(LOCAL, momentum=0.0)
    with jax.enable_x64(True):
        alg = relaxed_init(scaffold(make_local(**local), server_lr=0.8), beta=0.2)
    params, state, metrics, x, y, parts = run(alg, **sched)
    w, c, cs, lasts = scaffold_ri_reference(params, x, y, parts, beta=0.2, server_lr=0.8,
                                            **local, **sched)
    assert alg.name == "scaffold+ri"
    assert_close(state.params, w)
    assert_close(state.server_state, c)
    for cid in range(len(SIZES)):
        assert_close(client_row(state.client_states.inner, cid), cs[cid])
        assert_close(client_row(state.client_states.last_model, cid), lasts[cid])
    plain = scaffold_ri_reference(params, x, y, parts, beta=0.0, server_lr=0.8, **local,
                                  **sched)[0]
    assert global_norm(tree_map(np.subtract, plain, w)) > 1e-3


def feddyn_ri_reference(params, x, y, parts, *, beta, rule, alpha, lr, lr_decay, momentum,
                        weight_decay, clip, **sched):
    """FedDyn (alpha_k = alpha, as FL-Simulator) with relaxed starts s_i = w + beta (w - last_i),
    unweighted. The prox centre and h reference r_i and the aggregate G per ``rule``:
    'final' (Algorithm 1 with FedDyn's own rules): r_i = w, G = mean_S y_i;
    'start' (fljax's default): r_i = s_i, G = w + mean_S (y_i - s_i);
    'flsim' (FL-Simulator server/FedDyn.py + client/feddyn.py): r_i = s_i, G = mean_S y_i.
    Local gradient clip(g + alpha (h_i - r_i)) + (wd + alpha) y; h_i += y_i - r_i;
    w <- G + mean over ALL clients of h."""
    n_clients = len(parts)
    w = params
    hs, lasts = [zeros(params) for _ in range(n_clients)], [params] * n_clients
    for t, clients in rounds_of(parts, seed=SEED, **sched):
        aggregate = zeros(w)
        for p, cid, steps in clients:
            start = tree_map(lambda a, b: a + beta * (a - b), w, lasts[cid])
            ref, h = (w if rule == "final" else start), hs[cid]
            local = local_train(start, x, y, parts[cid], steps, lr=lr * lr_decay ** t,
                                momentum=momentum, weight_decay=weight_decay + alpha, clip=clip,
                                in_loss=lambda v: tree_map(lambda a, b: alpha * (a - b), h, ref))
            hs[cid] = tree_map(lambda a, b, c: a + b - c, h, local, ref)
            base = start if rule == "start" else zeros(w)
            aggregate = tree_map(lambda g, a, b: g + p * (a - b), aggregate, local, base)
            lasts[cid] = local
        gamma = tree_map(np.add, w, aggregate) if rule == "start" else aggregate
        w = tree_map(lambda g, *h: g + sum(h) / n_clients, gamma, *hs)
    return w, hs, lasts


@pytest.mark.parametrize("aggregate", ["start", "final", "mixed"])
def test_feddyn_with_relaxed_init_is_the_documented_rule(aggregate):
    """relaxed_init(feddyn) with aggregate='final' is Algorithm 1 with FedDyn's own rules, 'start'
    is fljax's default, 'mixed' is FL-Simulator's FedDyn + RI (fedinit.py's docstring)."""
    rule = {"mixed": "flsim"}.get(aggregate, aggregate)
    sched = dict(**STEPS, aggregation="uniform")
    local = dict(LOCAL, momentum=0.0)
    with jax.enable_x64(True):
        alg = relaxed_init(feddyn(make_local(**local), alpha=0.3, adaptive_alpha=False),
                           beta=0.2, aggregate=aggregate)
    params, state, metrics, x, y, parts = run(alg, **sched)
    w, hs, lasts = feddyn_ri_reference(params, x, y, parts, beta=0.2, rule=rule, alpha=0.3,
                                       **local, **sched)
    assert_close(state.params, w)
    for cid in range(len(SIZES)):
        assert_close(client_row(state.client_states.inner, cid), hs[cid])
        assert_close(client_row(state.client_states.last_model, cid), lasts[cid])
    for other in {"start", "final", "flsim"} - {rule}:
        moved = feddyn_ri_reference(params, x, y, parts, beta=0.2, rule=other, alpha=0.3,
                                    **local, **sched)[0]
        assert global_norm(tree_map(np.subtract, moved, w)) > 1e-3


def test_mixed_aggregate_needs_a_rebase_hook():
    """'mixed' re-measures the message's model part, so an algorithm must declare how (one line)."""
    with pytest.raises(FljaxError, match="fedavg does not") as error:
        relaxed_init(fedavg(REDUCTION_LOCAL), beta=0.1, aggregate="mixed")
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("aggregate,aggregation", [("start", "uniform"), ("final", "examples")])
def test_fedinit_with_beta_zero_is_fedavg_exactly(aggregate, aggregation):
    params, state, *_ = run(fedinit(REDUCTION_LOCAL, beta=0.0, aggregate=aggregate), **EPOCHS,
                            aggregation=aggregation)
    assert_equal_to_fedavg(state.params, aggregation)


# ------------------------------------------------------------------------------------------------
# FedGA

def fedga_reference(params, x, y, parts, *, beta, lr, lr_decay, momentum, weight_decay, clip,
                    **sched):
    """gbar = sum_S n_i g_i(x) / sum_S n_i; x_i,0 = x - beta (gbar - g_i(x));
    x += sum_S p_i (x_i,K - x)."""
    w = params
    for t, clients in rounds_of(parts, seed=SEED, **sched):
        grads, gbar = cohort_full_gradients(w, x, y, parts, [cid for _, cid, _ in clients])
        delta = zeros(w)
        for p, cid, steps in clients:
            start = tree_map(lambda a, gb, gi: a - beta * (gb - gi), w, gbar, grads[cid])
            local = local_train(start, x, y, parts[cid], steps, lr=lr * lr_decay ** t,
                                momentum=momentum, weight_decay=weight_decay, clip=clip)
            delta = tree_map(lambda d, a, b: d + p * (a - b), delta, local, w)
        w = tree_map(np.add, w, delta)
    return w


@pytest.mark.parametrize("client_chunk", [1, 3])
def test_fedga_matches_float64_reference(client_chunk):
    sched = dict(**EPOCHS, aggregation="uniform")   # as the official code; uneven clients
    with jax.enable_x64(True):
        alg = fedga(make_local(**LOCAL), beta=0.7)
    params, state, metrics, x, y, parts = run(alg, **sched, client_chunk=client_chunk)
    w = fedga_reference(params, x, y, parts, beta=0.7, **LOCAL, **sched)
    assert_close(state.params, w)
    assert [alg.exchanges(t) for t in range(3)] == [2, 2, 2]
    plain = fedga_reference(params, x, y, parts, beta=0.0, **LOCAL, **sched)
    assert global_norm(tree_map(np.subtract, plain, w)) > 1e-3


@pytest.mark.parametrize("aggregation", ["uniform", "examples"])
def test_fedga_with_beta_zero_is_fedavg_exactly(aggregation):
    alg = fedga(REDUCTION_LOCAL, beta=0.0)
    _, state, *_ = run(alg, **EPOCHS, aggregation=aggregation)
    assert_equal_to_fedavg(state.params, aggregation)
    assert alg.exchanges(0) == 2 and fedavg(REDUCTION_LOCAL).exchanges(0) == 1


# ------------------------------------------------------------------------------------------------
# large-batch SGD

def test_lbsgd_is_server_sgd_on_the_weighted_mean_full_gradient():
    lr, wd, mom, clip = 0.5, 1e-2, 0.6, 0.3
    sched = dict(batch=None, local_steps=1, local_epochs=None, aggregation="examples")
    params, state, _, x, y, parts = run(lbsgd(lr, weight_decay=wd, momentum=mom, clip_norm=clip),
                                        **sched)
    counts = np.array(SIZES)
    w, buf = params, None
    for t in range(3):
        with jax.enable_x64(True):
            cohort = np.asarray(sample_cohort(round_key(jax.random.PRNGKey(SEED), t)[0],
                                              len(SIZES), 3))
        grads = [mlp_loss_and_grad(w, x[parts[i]], y[parts[i]], np.ones(counts[i]))[1]
                 for i in cohort]
        gbar = tree_map(lambda *g: sum(counts[i] * gi for i, gi in zip(cohort, g))
                        / counts[cohort].sum(), *grads)
        scale = clip / max(global_norm(gbar), clip)
        d = tree_map(lambda g, a: scale * g + wd * a, gbar, w)
        buf = d if buf is None else tree_map(lambda b, a: mom * b + a, buf, d)
        w = tree_map(lambda a, b: a - lr * b, w, buf)
    assert_close(state.params, w)
    # Without weight decay, momentum or clipping it is FedSGD, bit for bit.
    _, plain, *_ = run(lbsgd(lr), **sched)
    _, sgd, *_ = run(fedsgd(lr), **sched)
    for a, b in zip(jax.tree.leaves(plain.params), jax.tree.leaves(sgd.params)):
        np.testing.assert_array_equal(a, b)


def test_scaffold_large_batch_with_full_local_batches_is_large_batch_sgd():
    """FedGA's Figure 2 (bottom) SCAFFOLD (LargeBatch): the GA code's SCAFFOLD with one local
    step. On a client's full batch its step is clip(g_i(x) + gbar(x) - g_i(x)) + wd x, the same
    for every client: large-batch SGD (without momentum, which one local step cannot carry)."""
    lr, wd, clip = 0.5, 1e-2, 0.3
    sched = dict(batch=None, local_steps=1, local_epochs=None, aggregation="examples")
    _, ga, *_ = run(scaffold(make_local(lr, 1.0, 0.0, wd, clip), option="GA"), **sched)
    _, lb, *_ = run(lbsgd(lr, weight_decay=wd, clip_norm=clip), **sched)
    assert_close(ga.params, lb.params)
    _, minibatch, *_ = run(scaffold(make_local(lr, 1.0, 0.0, wd, clip), option="GA"),
                           **{**sched, "batch": 2})
    assert global_norm(tree_map(np.subtract, minibatch.params, lb.params)) > 1e-3


# ------------------------------------------------------------------------------------------------
# API

BAD = {
    "fedinit_nan_beta": (lambda: fedinit(local_sgd(0.1), beta=float("nan")), "beta must be"),
    "ri_inf_beta": (lambda: relaxed_init(fedavg(local_sgd(0.1)), float("inf")), "beta must be"),
    "ri_string_beta": (lambda: relaxed_init(fedavg(local_sgd(0.1)), "0.1"), "beta must be"),
    "ri_unknown_aggregate": (lambda: relaxed_init(fedavg(local_sgd(0.1)), 0.1, "models"),
                             "aggregate must be one of"),
    "fedga_negative_beta": (lambda: fedga(local_sgd(0.1), beta=-1.0), "beta must be"),
    "fedga_nan_beta": (lambda: fedga(local_sgd(0.1), beta=float("nan")), "beta must be"),
    "gradalign_inf_beta": (lambda: gradalign(local_sgd(0.1), beta=float("inf")), "beta must be"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_hyperparameters_are_rejected(case):
    build, message = BAD[case]
    with pytest.raises(FljaxError, match=message):
        build()


def test_names_and_exchanges():
    local = local_sgd(0.1)
    assert fedinit(local).name == "fedinit" and fedinit(local).exchanges(0) == 1
    assert gradalign(local).name == "gradalign" and gradalign(local).exchanges(5) == 2
    assert fedga(local).name == "fedga"
    assert relaxed_init(fedga(local), 0.1).exchanges(0) == 2
    assert lbsgd(0.1).name == "lbsgd"
