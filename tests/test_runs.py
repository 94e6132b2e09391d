"""A batch of R runs in one program equals the R runs alone (float64): each run's cohorts exactly,
its model, server, client and probe states to 1e-12, with its hyperparameters traced in the batch
and Python floats alone. Every run has its own seed and its own split."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fljax
from fljax import FljaxError, algorithms, probes
from fljax.algorithms.fedbug import gradual_unfreezing
from fljax.data.federated import federate
from fljax.core.engine import make_round
from fljax.core.runs import take
from tests.test_fedavg_reference import NUM_CLASSES, tiny_problem

UNITS = (("fc1",), ("fc2",))


def splits(seed: int, clients: int = 6):
    """Run ``seed``'s own split of the tiny problem's 40 examples (sizes differ between runs)."""
    rng = np.random.default_rng(100 + seed)
    cuts = np.sort(rng.choice(np.arange(2, 39), clients - 1, replace=False))
    return np.split(rng.permutation(40), cuts)


def compare(build, hparams, seeds, *, rounds=3, run_chunk=None, probe_list=(), **settings):
    """Train the runs batched and alone; assert they agree; return the batch's final state."""
    size = len(seeds)
    settings = {"clients_per_round": 3, "batch_size": 4, "local_epochs": 1, **settings}
    with jax.enable_x64(True):
        x, y, _, model = tiny_problem()
        datas = [federate(x, y, splits(s), NUM_CLASSES) for s in seeds]
        params = [jax.tree.map(lambda a: a.astype(jnp.float64),
                               model.init(jax.random.PRNGKey(s))) for s in seeds]
        batched = make_round(build, model, datas, runs=size, run_chunk=run_chunk,
                             probes=probe_list, **settings)
        state = batched.init_state(params, seeds, hparams)
        cohorts = []
        for _ in range(rounds):
            state, metrics = batched(state)
            cohorts.append(np.asarray(metrics["clients"]))
        for r in range(size):
            alone_values = {k: v[r] for k, v in hparams.items()}     # Python numbers
            alone = make_round(build(alone_values), model, datas[r], probes=probe_list,
                               **settings)
            own = alone.init_state(params[r], seeds[r])
            for t in range(rounds):
                own, own_metrics = alone(own)
                np.testing.assert_array_equal(cohorts[t][r], own_metrics["clients"])
            mine = take(state, r)
            for a, b in zip(jax.tree.leaves((mine.params, mine.server_state, mine.client_states,
                                             mine.probes)),
                            jax.tree.leaves((own.params, own.server_state, own.client_states,
                                             own.probes))):
                np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
            assert int(mine.round) == rounds
    return jax.device_get(state)


@pytest.mark.parametrize("run_chunk", [None, 2], ids=["scan_over_runs", "vmap_over_runs"])
def test_fedavg_with_a_probe_batched_equals_alone(run_chunk):
    build = lambda h: algorithms.fedavg(algorithms.local_sgd(
        h["lr"], momentum=h["momentum"], weight_decay=h["weight_decay"], round_decay=0.9))
    compare(build, {"lr": [0.3, 0.1], "momentum": [0.0, 0.9], "weight_decay": [0.01, 0.0]},
            [0, 1], run_chunk=run_chunk, probe_list=[probes.pseudo_gradient_diversity()])


def test_scaffold_under_bernoulli_participation_batched_equals_alone():
    build = lambda h: algorithms.scaffold(algorithms.local_sgd(h["lr"], clip_norm=h["clip"]),
                                          server_lr=h["server_lr"])
    compare(build, {"lr": [0.2, 0.05], "clip": [1.0, 0.3], "server_lr": [1.0, 0.5]}, [3, 4],
            participation="bernoulli", local_steps=3, local_epochs=None, rounds=4)


def test_feddyn_then_fedavg_switches_at_each_runs_own_round():
    def build(h):
        dyn = algorithms.feddyn(algorithms.local_sgd(0.1), alpha=h["alpha"])
        return algorithms.switch(dyn, algorithms.fedavg(algorithms.local_sgd(h["lr"])),
                                 h["switch_at"])

    state = compare(build, {"alpha": [0.1, 0.3], "lr": [0.1, 0.05], "switch_at": [1, 5]},
                    [5, 6], rounds=3, aggregation="uniform")
    # run 0 switched after round 1 and trained FedAvg since; run 1 still runs FedDyn, whose h
    # moved: each run took its own branch
    assert [int(d) for d in state.server_state[1]["rounds_done"]] == [3, 3]
    h_mean = state.server_state[0]["state"].h_mean["fc1"]["kernel"]
    assert np.abs(h_mean[1]).max() > np.abs(h_mean[0]).max() > 0


def test_ditto_personal_models_batched_equal_alone():
    build = lambda h: algorithms.ditto(algorithms.local_sgd(h["lr"]), lam=h["lam"])
    compare(build, {"lr": [0.2, 0.1], "lam": [0.5, 0.05]}, [1, 2], local_steps=2,
            local_epochs=None)


def test_fedbug_over_fedprox_with_traced_share_and_mu_batched_equals_alone():
    build = lambda h: gradual_unfreezing(
        algorithms.fedprox(algorithms.local_sgd(0.2, momentum=0.5), mu=h["mu"]), UNITS,
        h["fraction"])
    compare(build, {"mu": [0.1, 0.01], "fraction": [1.0, 0.3]}, [0, 1], local_steps=4,
            local_epochs=None)


def test_an_inactive_run_keeps_its_state_and_the_others_train():
    with jax.enable_x64(True):
        x, y, parts, model = tiny_problem()
        build = lambda h: algorithms.fedavg(algorithms.local_sgd(h["lr"]))
        round_fn = make_round(build, model, federate(x, y, parts, NUM_CLASSES), runs=2,
                              clients_per_round=2, batch_size=4, local_steps=2)
        state = round_fn.init_state(model.init(jax.random.PRNGKey(0)), [0, 1], {"lr": [0.1, 0.2]})
        before = jax.device_get(state)
        state, _ = round_fn(state, np.array([False, True]))
        after = jax.device_get(state)
    assert [int(r) for r in after.round] == [0, 1]
    for a, b in zip(jax.tree.leaves(take(before.params, 0)), jax.tree.leaves(take(after.params, 0))):
        np.testing.assert_array_equal(a, b)
    assert not np.allclose(take(before.params, 1)["fc1"]["kernel"],
                           take(after.params, 1)["fc1"]["kernel"])
    assert round_fn.compilations() == 1


@pytest.mark.parametrize("change, message", [
    (dict(seeds=[0]), "needs 2 seeds, got 1"),
    (dict(hparams={"lr": [0.1]}), "one value per run (2)"),
    (dict(hparams={"lr": [0.1, -1.0]}), "learning_rate must be > 0"),
    (dict(data=3), "give one for every run or one per run"),
    (dict(runs=0), "runs must be an integer >= 1"),
    (dict(run_chunk=5), "run_chunk must be an integer in [1, 2]"),
])
def test_bad_batches_are_one_line_errors(change, message):
    x, y, parts, model = tiny_problem()
    data = federate(x, y, parts, NUM_CLASSES)
    build = lambda h: algorithms.fedavg(algorithms.local_sgd(h["lr"]))
    args = {"seeds": [0, 1], "hparams": {"lr": [0.1, 0.2]}, "data": 1, "runs": 2,
            "run_chunk": None, **change}
    with pytest.raises(FljaxError) as error:
        round_fn = make_round(build, model, [data] * args["data"], runs=args["runs"],
                              run_chunk=args["run_chunk"], clients_per_round=2, batch_size=4,
                              local_steps=1)
        round_fn.init_state(model.init(jax.random.PRNGKey(0)), args["seeds"], args["hparams"])
    assert message in str(error.value) and "\n" not in str(error.value)


def test_an_algorithm_with_hyperparameters_needs_a_builder():
    x, y, parts, model = tiny_problem()
    round_fn = make_round(fljax.fedavg(fljax.local_sgd(0.1)), model,
                          federate(x, y, parts, NUM_CLASSES), clients_per_round=2, batch_size=4,
                          local_steps=1)
    with pytest.raises(FljaxError, match="takes no hyperparameters"):
        round_fn.init_state(model.init(jax.random.PRNGKey(0)), 0, {"lr": 0.1})


SPREAD_ROWS = """
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from fljax.core.runs import stack, take
mesh = Mesh(np.array(jax.devices()), ("runs",))
x = jax.device_put(jnp.arange(24.0).reshape(8, 3), NamedSharding(mesh, P("runs")))
shared = jax.device_put(jnp.arange(8.0), NamedSharding(mesh, P()))
rows = [take({"x": x, "shared": shared}, r) for r in range(8)]
for r, row in enumerate(rows):
    assert np.array_equal(row["x"], np.arange(24.0).reshape(8, 3)[r]) and float(row["shared"]) == r
    assert row["x"].devices() == {jax.devices()[r // 2]}, row["x"].devices()
assert np.array_equal(stack(rows)["x"], np.arange(24.0).reshape(8, 3))
print("OK")
"""


def test_a_run_of_a_batch_spread_over_devices_is_read_from_its_own_device():
    """``take`` reads run r's row from the device that holds it (no program over every device,
    whose collective could wait forever on CPU devices sharing two cores), and ``stack`` stacks
    rows from different devices."""
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    done = subprocess.run([sys.executable, "-c", SPREAD_ROWS], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "OK", done.stderr[-2000:]
