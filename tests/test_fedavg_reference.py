"""FedAvg and FedSGD equal float64 references written from McMahan et al. 2017's equations."""

import jax
import numpy as np
import optax
import pytest

from fljax import algorithms
from fljax.data.federated import federate
from fljax.core.engine import init_state, make_round
from fljax.models import MLP, from_module
from tests.reference import client_schedule, global_norm, mlp_loss_and_grad, tree_map

SIZES = [7, 3, 12, 5, 9, 4]
NUM_CLASSES = 3


def tiny_problem(seed=0):
    rng = np.random.default_rng(seed)
    n = sum(SIZES)
    x = rng.normal(size=(n, 2, 2, 1))
    y = rng.integers(0, NUM_CLASSES, n)
    perm = rng.permutation(n)
    parts = np.split(perm, np.cumsum(SIZES)[:-1])
    model = from_module("tiny", MLP(hidden=(5,), num_classes=NUM_CLASSES), (2, 2, 1), NUM_CLASSES)
    return x, y, parts, model


def fedavg_reference(params, x, y, parts, *, seed, rounds, cohort, batch, local_steps,
                     local_epochs, lr, lr_decay, weight_decay, clip, server_lr, aggregation):
    """w^{t+1} = w^t - eta_g sum_i p_i (w^t - y_i,K), y_i,k+1 = y_i,k - eta_l decay^t g(y_i,k)."""
    w = tree_map(lambda a: np.asarray(a, np.float64), params)
    counts = np.array([len(p) for p in parts])
    key = jax.random.PRNGKey(seed)
    for t in range(rounds):
        schedule = list(client_schedule(key, t, cohort, counts, batch, local_steps, local_epochs,
                                        counts.max()))
        ids = [cid for cid, _ in schedule]
        p = counts[ids] / counts[ids].sum() if aggregation == "examples" else np.full(
            cohort, 1.0 / cohort)
        delta = tree_map(np.zeros_like, w)
        for weight, (cid, steps) in zip(p, schedule):
            local = tree_map(np.copy, w)
            for positions, mask in steps:
                examples = parts[cid][np.minimum(positions, counts[cid] - 1)]
                _, g = mlp_loss_and_grad(local, x[examples], y[examples], mask)
                if clip is not None:
                    g = tree_map(lambda a: a * clip / max(global_norm(g), clip), g)
                g = tree_map(lambda a, b: a + weight_decay * b, g, local)
                local = tree_map(lambda a, b: a - lr * lr_decay ** t * b, local, g)
            delta = tree_map(lambda d, a, b: d + weight * (a - b), delta, w, local)
        w = tree_map(lambda a, d: a - server_lr * d, w, delta)
    return w


CASES = {
    "steps": dict(batch=4, local_steps=3, local_epochs=None, lr=0.3, lr_decay=1.0,
                  weight_decay=0.0, clip=None, server_lr=1.0, aggregation="examples"),
    "epochs_uneven_clients": dict(batch=5, local_steps=None, local_epochs=2, lr=0.2, lr_decay=0.9,
                                  weight_decay=1e-2, clip=None, server_lr=0.7,
                                  aggregation="examples"),
    "uniform_clip": dict(batch=3, local_steps=None, local_epochs=1, lr=0.5, lr_decay=1.0,
                         weight_decay=0.0, clip=0.5, server_lr=1.3, aggregation="uniform"),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("client_chunk", [1, 3])
def test_fedavg_matches_float64_reference(case, client_chunk):
    c = CASES[case]
    x, y, parts, model = tiny_problem()
    with jax.enable_x64(True):
        params = jax.tree.map(lambda a: np.asarray(a, np.float64), model.init(jax.random.PRNGKey(1)))
        expected = fedavg_reference(params, x, y, parts, seed=3, rounds=3, cohort=3, **c)
        alg = algorithms.fedavg(
            algorithms.local_sgd(c["lr"], round_decay=c["lr_decay"],
                                 weight_decay=c["weight_decay"], clip_norm=c["clip"]),
            optax.sgd(c["server_lr"]))
        round_fn = make_round(alg, model, federate(x, y, parts, NUM_CLASSES),
                              clients_per_round=3, batch_size=c["batch"],
                              local_steps=c["local_steps"], local_epochs=c["local_epochs"],
                              aggregation=c["aggregation"], client_chunk=client_chunk)
        state = init_state(alg, params, len(parts), seed=3)
        for _ in range(3):
            state, _ = round_fn(state)
        got = jax.tree.map(np.asarray, state.params)
    assert jax.tree.leaves(got)[0].dtype == np.float64
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-13)
    # The rounds really moved the model.
    assert global_norm(tree_map(lambda a, b: a - b, expected, params)) > 1e-2


def test_one_full_batch_step_is_centralized_gradient_descent():
    x, y, parts, model = tiny_problem(seed=1)
    lr = 0.4
    with jax.enable_x64(True):
        params = jax.tree.map(lambda a: np.asarray(a, np.float64), model.init(jax.random.PRNGKey(2)))
        alg = algorithms.fedavg(optax.sgd(lr))
        round_fn = make_round(alg, model, federate(x, y, parts, NUM_CLASSES),
                              clients_per_round=len(parts), batch_size=None, local_steps=1)
        state, _ = round_fn(init_state(alg, params, len(parts), seed=0))
        got = jax.tree.map(np.asarray, state.params)
    w = tree_map(lambda a: np.asarray(a), params)
    _, g = mlp_loss_and_grad(w, x, y, np.ones(len(y)))
    expected = tree_map(lambda a, b: a - lr * b, w, g)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-13)


def test_fedsgd_is_one_full_batch_gradient_step_per_round():
    x, y, parts, model = tiny_problem(seed=2)
    with jax.enable_x64(True):
        params = jax.tree.map(lambda a: np.asarray(a, np.float64), model.init(jax.random.PRNGKey(0)))
        alg = algorithms.fedsgd(0.25)
        round_fn = make_round(alg, model, federate(x, y, parts, NUM_CLASSES),
                              clients_per_round=len(parts), batch_size=None, local_steps=1)
        state = init_state(alg, params, len(parts), seed=0)
        for _ in range(2):
            state, _ = round_fn(state)
        got = jax.tree.map(np.asarray, state.params)
    w = tree_map(np.asarray, params)
    for _ in range(2):
        _, g = mlp_loss_and_grad(w, x, y, np.ones(len(y)))
        w = tree_map(lambda a, b: a - 0.25 * b, w, g)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(w)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-13)


def test_full_gradient_is_the_mean_gradient_over_the_client_data():
    """ctx.full_gradient (SCAFFOLD option I, FedGA) against the numpy gradient of each client."""
    x, y, parts, model = tiny_problem(seed=4)

    def start_from_gradient_step(ctx, key):
        return jax.tree.map(lambda w, g: w - 0.3 * g, ctx.params, ctx.full_gradient(ctx.params))

    with jax.enable_x64(True):
        params = jax.tree.map(lambda a: np.asarray(a, np.float64), model.init(jax.random.PRNGKey(5)))
        alg = algorithms.fedavg(optax.sgd(0.0))._replace(client_start=start_from_gradient_step)
        round_fn = make_round(alg, model, federate(x, y, parts, NUM_CLASSES),
                              clients_per_round=len(parts), batch_size=4, local_steps=1)
        state, _ = round_fn(init_state(alg, params, len(parts), seed=0))
        got = jax.tree.map(np.asarray, state.params)
    # sum_i p_i * 0.3 * g_i(w) with p_i = n_i / n is 0.3 * the gradient over all the data.
    _, g = mlp_loss_and_grad(params, x, y, np.ones(len(y)))
    expected = tree_map(lambda a, b: a - 0.3 * b, params, g)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-13)
