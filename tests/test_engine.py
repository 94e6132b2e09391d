"""Engine properties: determinism, one compilation, client strategies and devices agree."""

import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import optax
import pytest

from fljax import FljaxError, algorithms
from fljax.data.federated import federate
from fljax.core.engine import init_state, make_round, sample_cohort
from fljax.models import make_model


@pytest.fixture(scope="module")
def setup():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 8, 8, 1)).astype(np.float32)
    y = rng.integers(0, 10, 300)
    sizes = rng.integers(5, 30, 12)
    parts = np.split(rng.permutation(300)[:sizes.sum()], np.cumsum(sizes)[:-1])
    data = federate(x, y, parts, 10)
    model = make_model("mlp", (8, 8, 1), 10)
    alg = algorithms.fedavg(algorithms.local_sgd(0.1, momentum=0.5),
                            optax.sgd(1.0, momentum=0.9))
    return data, model, alg


def run_rounds(setup, rounds=3, seed=0, **kwargs):
    data, model, alg = setup
    kwargs = {"clients_per_round": 4, "batch_size": 8, "local_epochs": 2, **kwargs}
    round_fn = make_round(alg, model, data, **kwargs)
    state = init_state(alg, model.init(jax.random.PRNGKey(0)), data.num_clients, seed)
    history = []
    for _ in range(rounds):
        state, metrics = round_fn(state)
        history.append(jax.device_get(metrics))
    return jax.device_get(state), history, round_fn


def assert_trees_equal(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_same_seed_gives_bit_identical_state_and_metrics(setup):
    state_a, hist_a, _ = run_rounds(setup)
    state_b, hist_b, _ = run_rounds(setup)
    assert_trees_equal(state_a, state_b)
    assert_trees_equal(hist_a, hist_b)
    state_c, _, _ = run_rounds(setup, seed=1)
    assert not np.array_equal(state_a.params["fc1"]["kernel"], state_c.params["fc1"]["kernel"])


def test_second_round_compiles_nothing(setup):
    _, _, round_fn = run_rounds(setup, rounds=4)
    assert round_fn.compilations() == 1


def test_round_counter_and_cohort(setup):
    state, history, _ = run_rounds(setup, rounds=3)
    assert int(state.round) == 3
    for m in history:
        clients = m["clients"]
        assert len(set(clients.tolist())) == 4 and clients.min() >= 0 and clients.max() < 12
        assert np.isfinite(m["train_loss"])
    # Clients sampled in different rounds differ (fold_in(key, round)).
    assert len({tuple(m["clients"]) for m in history}) > 1


def test_cohort_sampling_is_uniform_without_replacement():
    keys = jax.random.split(jax.random.PRNGKey(0), 4000)
    cohorts = np.asarray(jax.vmap(lambda k: sample_cohort(k, 10, 3))(keys))
    assert all(len(set(c)) == 3 for c in cohorts)
    freq = np.bincount(cohorts.ravel(), minlength=10) / cohorts.size
    np.testing.assert_allclose(freq, 0.1, atol=0.01)


def test_local_work_steps_per_client(setup):
    data, _, _ = setup
    counts = np.asarray(data.count)
    _, history, _ = run_rounds(setup, rounds=1, batch_size=8, local_epochs=3)
    m = history[0]
    np.testing.assert_array_equal(m["client_steps"], 3 * -(-counts[m["clients"]] // 8))
    _, history, _ = run_rounds(setup, rounds=1, local_steps=5, local_epochs=None)
    np.testing.assert_array_equal(history[0]["client_steps"], 5)


@pytest.mark.parametrize("chunk", [2, 4])
def test_client_strategies_agree(setup, chunk):
    sequential, _, _ = run_rounds(setup, client_chunk=1)
    chunked, _, _ = run_rounds(setup, client_chunk=chunk)
    for a, b in zip(jax.tree.leaves(sequential), jax.tree.leaves(chunked)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kwargs, message", [
    (dict(clients_per_round=13), "clients_per_round must be in [1, 12]"),
    (dict(clients_per_round=0), "clients_per_round must be in [1, 12]"),
    (dict(batch_size=0), "batch_size must be >= 1"),
    (dict(local_steps=3), "exactly one of local_steps and local_epochs"),
    (dict(local_epochs=0), "must be >= 1, got 0"),
    (dict(aggregation="median"), "aggregation must be one of"),
    (dict(client_chunk=3), "client_chunk must divide"),
    (dict(num_devices=64), "num_devices must be in"),
])
def test_bad_round_arguments(setup, kwargs, message):
    data, model, alg = setup
    args = {"clients_per_round": 4, "batch_size": 8, "local_epochs": 2, **kwargs}
    with pytest.raises(FljaxError, match=message.replace("[", r"\[").replace("]", r"\]")):
        make_round(alg, model, data, **args)


MULTI_DEVICE = textwrap.dedent("""
    import jax, numpy as np, optax
    from fljax import algorithms
    from fljax.data.federated import federate
    from fljax import probes
    from fljax.core.engine import init_state, make_round
    from fljax.models import make_model
    assert len(jax.devices()) == 8
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 8, 8, 1)).astype(np.float32)
    y = rng.integers(0, 10, 400)
    data = federate(x, y, np.array_split(rng.permutation(400), 16), 10)
    model = make_model("mlp", (8, 8, 1), 10)
    fedavgm = algorithms.fedavg(algorithms.local_sgd(0.1), optax.sgd(1.0, momentum=0.9))
    fedga = algorithms.fedga(algorithms.local_sgd(0.1), beta=0.5)   # a first exchange, psum-ed
    # Probes: client outputs summed across devices, per-client probe state sharded with the cohort.
    probe_list = [probes.pseudo_gradient_diversity(), probes.cosine_previous()]
    names = ["pseudo_gradient_diversity", "cosine_previous"]
    for alg, layouts, participation in [
            (fedavgm, [(1, 1), (8, 1), (2, 4)], "uniform"),
            (fedga, [(1, 1), (4, 2)], "bernoulli")]:      # 16 slots, dealt over the devices
        results = []
        for devices, chunk in layouts:
            round_fn = make_round(alg, model, data, clients_per_round=8, batch_size=8,
                                  local_epochs=2, client_chunk=chunk, num_devices=devices,
                                  participation=participation, probes=probe_list)
            state = round_fn.init_state(model.init(jax.random.PRNGKey(0)), 0)
            for _ in range(3):
                state, metrics = round_fn(state)
            assert round_fn.compilations() == 1
            results.append((jax.device_get(state.params), np.asarray(metrics["clients"]),
                            [float(metrics[name]) for name in names]))
        for params, clients, measured in results[1:]:   # (slots are dealt: compare sets)
            np.testing.assert_array_equal(np.sort(clients), np.sort(results[0][1]))
            for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(results[0][0])):
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(measured, results[0][2], rtol=1e-4)
            assert all(np.isfinite(measured))
    print("OK")
""")


def test_eight_devices_match_one_device():
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8"
    env = {**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", MULTI_DEVICE], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("OK")
