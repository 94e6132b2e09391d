"""The population sharded over devices and processes equals the one-device run.

Each case runs in fresh processes (the device count is fixed when JAX starts): 8 CPU devices in
one process, and 2 processes x 4 CPU devices joined by ``jax.distributed`` on localhost (gloo
collectives). Results agree to float32 rounding, not bit for bit: the cohort's messages are summed
per device and then across devices, in another order than one device's sum.
"""

import os
import socket
import subprocess
import sys
import textwrap

import jax
import numpy as np
import orbax.checkpoint as ocp

from tests.xla_build import xla_flags

SHARDED = textwrap.dedent("""
import os, tempfile
import jax, numpy as np
from jax.sharding import PartitionSpec as P
from fljax import algorithms
from fljax.runner.checkpoint import Checkpoints
from fljax.data.federated import federate
from fljax.core.engine import make_round
from fljax.models import make_model
assert len(jax.devices()) == 8
rng = np.random.default_rng(0)
x = rng.normal(size=(400, 8, 8, 1)).astype(np.float32)
y = rng.integers(0, 10, 400)
sizes = rng.integers(5, 45, 16)                       # unequal clients, unequal device blocks
data = federate(x, y, np.split(rng.permutation(400)[:sizes.sum()], np.cumsum(sizes)[:-1]), 10)
model = make_model("mlp", (8, 8, 1), 10)
scaffold = algorithms.scaffold(algorithms.local_sgd(0.1))        # a control variate per client
feddyn = algorithms.feddyn(algorithms.local_sgd(0.1), alpha=0.1)   # a gradient memory per client
for alg, participation in [(scaffold, "uniform"), (feddyn, "bernoulli")]:
    results = []
    for devices in (1, 8, 4):
        round_fn = make_round(alg, model, data, clients_per_round=8, batch_size=8,
                              local_epochs=1, num_devices=devices, participation=participation)
        state = round_fn.init_state(model.init(jax.random.PRNGKey(0)), 0)
        for _ in range(3):
            state, metrics = round_fn(state)
        if devices > 1:     # each device holds N/D clients' states and examples
            for leaf in jax.tree.leaves(state.client_states):
                assert leaf.sharding.spec == P("clients"), leaf.sharding
                assert {s.data.shape[0] for s in leaf.addressable_shards} == {16 // devices}
            x_shards = round_fn._data.x.addressable_shards
            assert len(x_shards) == devices
            assert x_shards[0].data.shape[0] < 400 // devices + 45
            with tempfile.TemporaryDirectory() as out:   # saved and restored shard by shard
                checkpoints = Checkpoints(out)
                checkpoints.save(3, state, {"case": 1})
                like = round_fn.init_state(model.init(jax.random.PRNGKey(1)), 0)
                restored = checkpoints.restore(3, like, {"case": 1})
                checkpoints.close()
            for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(state)):
                assert a.sharding == b.sharding
                np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
            resumed, _ = round_fn(restored)
        else:
            resumed, _ = round_fn(jax.tree.map(lambda a: a.copy(), state))
        results.append((jax.device_get(state), jax.device_get(resumed),
                        np.sort(np.asarray(metrics["clients"]))))
    for got, got_resumed, clients in results[1:]:
        np.testing.assert_array_equal(clients, results[0][2])
        for ours, want in ((got, results[0][0]), (got_resumed, results[0][1])):
            for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(want)):
                np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)
print("OK")
""")


def _run(script, env):
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def _cpu_env(**more):
    """The test process's environment for a CPU child, its XLA flags ``more``'s and the tests'."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
    more["XLA_FLAGS"] = xla_flags(more.get("XLA_FLAGS", ""))
    return {**env, "JAX_PLATFORMS": "cpu", **more}


def test_sharded_population_matches_one_device_and_checkpoints_by_shard():
    env = _cpu_env(XLA_FLAGS="--xla_force_host_platform_device_count=8")
    assert _run(SHARDED, env).strip().endswith("OK")


def _free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


RUNS = textwrap.dedent("""
import sys
import fljax
out, devices, processes, process_id, address = sys.argv[1:6]
for algorithm in ("fedavg", "scaffold"):
    config = fljax.ExperimentConfig().replace(
        num_clients=16, clients_per_round=8, algorithm=algorithm, local_epochs=1, batch_size=16,
        eval_every=2, checkpoint_every=2, out_dir=f"{out}/{algorithm}", num_devices=int(devices),
        num_processes=int(processes), process_id=int(process_id),
        coordinator_address=address if address != "-" else None)
    stops = (4,) if int(devices) == 1 else (2, 4)           # stopped after round 2, resumed
    for rounds in stops:
        fljax.run(config.replace(rounds=rounds), progress=False)
""")


def _train(out_dir, devices, processes):
    """FedAvg then SCAFFOLD, in ``processes`` processes over ``devices`` devices in all."""
    if processes == 1:
        env = _cpu_env(XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
        address = "-"
    else:
        env = _cpu_env(JAX_NUM_CPU_DEVICES=str(devices // processes))
        address = f"localhost:{_free_port()}"
    runs = [subprocess.Popen([sys.executable, "-c", RUNS, out_dir, str(devices), str(processes),
                              str(i), address], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for i in range(processes)]
    for run in runs:
        _, err = run.communicate(timeout=300)
        assert run.returncode == 0, err[-3000:]


def _saved_state(out_dir, round_index):
    """Every array of the checkpoint of ``round_index``, read onto this process's one device."""
    path = os.path.join(out_dir, "checkpoints", str(round_index), "state")
    checkpointer = ocp.StandardCheckpointer()
    here = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=here),
                          checkpointer.metadata(path).item_metadata.tree)
    return jax.tree.leaves(checkpointer.restore(path, target))


def test_two_processes_match_one_device_with_resume(tmp_path):
    """2 processes x 4 devices, stopped after round 2 and resumed, end where one device's
    uninterrupted run does: FedAvg (no client state) and SCAFFOLD (a control variate per client,
    sharded over both processes); each round is logged once. (1 process x 8 devices is checked
    against one device, with a resume from a sharded checkpoint, in the test above.)"""
    _train(str(tmp_path / "one"), 1, 1)
    _train(str(tmp_path / "two"), 8, 2)
    for algorithm in ("fedavg", "scaffold"):
        want = _saved_state(str(tmp_path / "one" / algorithm), 4)
        got = _saved_state(str(tmp_path / "two" / algorithm), 4)
        assert len(got) == len(want) and (algorithm == "fedavg" or len(want) > 5)
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)
        with open(tmp_path / "two" / algorithm / "metrics.jsonl") as f:
            rounds = [line for line in f if '"kind": "round"' in line]
        assert len(rounds) == 4                  # rounds 1-4, once each, by process 0
