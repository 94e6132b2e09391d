"""Communication and compute accounting: FLOPs of compiled programs counted through their loops,
bytes from each algorithm's payload, totals in the log and the results table."""

import json
import os
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fljax
from fljax.accounting import client_bits, hlo_flops, param_bytes
from fljax.runner.checkpoint import Checkpoints
from fljax.core.engine import RoundState
from fljax.runner.train import results_table, run


def compiled_text(fn, *args) -> str:
    return jax.jit(fn).lower(*args).compile().as_text()


X, W = jnp.ones((64, 128)), jnp.ones((128, 128))
MATMUL = 2 * 64 * 128 * 128


def test_loops_are_counted_by_their_trip_counts():
    def scanned(x, w):
        return jax.lax.scan(lambda c, _: (jnp.tanh(c @ w), None), x, None, length=10)[0]

    def nested_then_branch(x, w):
        def outer(c, _):
            return jax.lax.scan(lambda c, _: (jnp.tanh(c @ w), None), c, None, length=3)[0], None

        c = jax.lax.scan(outer, x, None, length=4)[0]
        return jax.lax.cond(c.sum() > 0, lambda: c @ w @ w, lambda: c @ w)   # the larger: 2

    assert hlo_flops(compiled_text(scanned, X, W)) == 10 * MATMUL
    assert hlo_flops(compiled_text(nested_then_branch, X, W)) == (12 + 2) * MATMUL
    # XLA's own analysis counts the loop body once:
    analysis = jax.jit(scanned).lower(X, W).compile().cost_analysis()
    analysis = analysis[0] if isinstance(analysis, list) else analysis
    assert analysis["flops"] < 2 * MATMUL


def test_convolutions_count_their_multiply_adds():
    x, kernel = jnp.ones((8, 28, 28, 3)), jnp.ones((5, 5, 3, 16))
    conv = lambda x, k: jax.lax.conv_general_dilated(x, k, (1, 1), "SAME",
                                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
    assert hlo_flops(compiled_text(conv, x, kernel)) == 2 * 8 * 28 * 28 * 16 * 5 * 5 * 3


def test_elementwise_work_counts_once_per_element_in_and_out_of_fusions_and_loops():
    """a * b + exp(a) on [1000] is 3 ops per element, a sum over it one per input element (plus
    the partial sums where XLA reduces in two stages); in a 10-step scan, 10 times; none of it
    counts without ``elementwise``."""
    a, b = jnp.linspace(0.0, 1.0, 1000), jnp.linspace(1.0, 2.0, 1000)
    vector = lambda a, b: a * b + jnp.exp(a)
    reduce = lambda a, b: (a * b).sum()
    scanned = lambda a, b: jax.lax.scan(lambda c, _: (c * b + jnp.exp(c), None), a, None,
                                        length=10)[0]
    assert hlo_flops(compiled_text(vector, a, b), elementwise=True) == 3 * 1000
    assert 2 * 1000 <= hlo_flops(compiled_text(reduce, a, b), elementwise=True) <= 2 * 1000 + 64
    # each step also adds to the loop counter and compares it with the trip count
    assert hlo_flops(compiled_text(scanned, a, b), elementwise=True) == 10 * (3 * 1000 + 2)
    assert hlo_flops(compiled_text(vector, a, b)) == 0
    matmul_and_tanh = lambda x, w: jnp.tanh(x @ w)
    assert hlo_flops(compiled_text(matmul_and_tanh, X, W), elementwise=True) == MATMUL + 64 * 128


@pytest.fixture(scope="module")
def digits():
    ds = fljax.load_dataset("digits")
    parts = fljax.data.iid(ds.y_train, 10, seed=0)
    return ds, fljax.federate(ds.x_train, ds.y_train, parts, ds.num_classes)


def test_round_flops_grow_linearly_with_local_steps(digits):
    """The round's count is (fixed part) + K x (one step of every client)."""
    ds, data = digits
    model = fljax.make_model("mlp", ds.x_train.shape[1:], ds.num_classes)
    alg = fljax.fedavg(fljax.local_sgd(0.05))
    flops = {}
    for steps in (2, 3, 5):
        round_fn = fljax.make_round(alg, model, data, clients_per_round=4, batch_size=16,
                                    local_steps=steps)
        flops[steps] = round_fn.flops(round_fn.init_state(model.init(jax.random.PRNGKey(0)), 0))
    step = flops[3] - flops[2]
    assert flops[5] - flops[3] == 2 * step
    # One SGD step of the 64-200-200-10 MLP on a batch of 16, forward and backward, is about
    # 3 x 2 x 16 x (64*200 + 200*200 + 200*10) FLOPs; four clients take one each.
    forward = 2 * 16 * (64 * 200 + 200 * 200 + 200 * 10)
    assert 2.5 * forward * 4 <= step <= 3.5 * forward * 4


def test_feddyn_does_fedavgs_matmuls_plus_vector_work_and_keeps_one_model_per_client(digits):
    """FedDyn's local step adds -<grad L_k, theta> + alpha/2 ||theta - theta^t||^2 to FedAvg's:
    the same matmuls, 3-6 more elementwise FLOPs per parameter per step (visible only with
    ``elementwise``); its client state is one model-sized vector (grad L_k), FedAvg's none."""
    from fljax.accounting import param_bytes
    ds, data = digits
    model = fljax.make_model("mlp", ds.x_train.shape[1:], ds.num_classes)
    params = model.init(jax.random.PRNGKey(0))
    counted, stored = {}, {}
    for name, alg in (("fedavg", fljax.fedavg(fljax.local_sgd(0.05))),
                      ("feddyn", fljax.feddyn(fljax.local_sgd(0.05), alpha=0.1))):
        round_fn = fljax.make_round(alg, model, data, clients_per_round=4, batch_size=16,
                                    local_steps=5)
        state = round_fn.init_state(params, 0)
        counted[name] = (round_fn.flops(state), round_fn.flops(state, elementwise=True))
        stored[name] = param_bytes(state.client_states) / (10 * param_bytes(params))
    assert counted["feddyn"][0] == counted["fedavg"][0]
    extra = counted["feddyn"][1] - counted["fedavg"][1]
    size = sum(a.size for a in jax.tree.leaves(params))
    assert 3 * 4 * 5 * size <= extra <= 6 * 4 * 5 * size      # 3-6 per parameter per step (4.45)
    assert stored == {"fedavg": 0.0, "feddyn": 1.0}


def test_bytes_follow_each_algorithm_payload(digits, tmp_path):
    """SCAFFOLD sends a control variate both ways (2x FedAvg's bytes), FedGA exchanges twice, and
    the log's totals are the sum of its rounds."""
    ds, _ = digits
    model = fljax.make_model("mlp", ds.x_train.shape[1:], ds.num_classes)
    model_bytes = param_bytes(model.init(jax.random.PRNGKey(0)))
    assert client_bits(fljax.fedcm(fljax.local_sgd(0.1)), 0, {"w": jax.numpy.zeros(25)}) == (
        2 * 25 * 32, 25 * 32)
    per_round = {}
    for name in ("fedavg", "scaffold", "fedga"):
        config = fljax.ExperimentConfig(algorithm=name, rounds=3, eval_every=3, num_clients=10,
                                        clients_per_round=4, local_steps=2, local_epochs=None,
                                        target_accuracy=0.05, out_dir=str(tmp_path / name))
        evaluations = run(config, progress=False)
        records = [json.loads(line) for line in open(os.path.join(config.out_dir,
                                                                  "metrics.jsonl"))]
        rounds = [r for r in records if r["kind"] == "round"]
        per_round[name] = rounds[0]["bytes_up"]
        assert evaluations[-1]["bytes"] == sum(r["bytes_up"] + r["bytes_down"] for r in rounds)
        assert evaluations[-1]["total_flops"] == pytest.approx(sum(r["flops"] for r in rounds))
        assert "reached at round 3" in results_table(evaluations, name, 0.05)
    assert per_round["fedavg"] == 4 * model_bytes
    assert per_round["scaffold"] == per_round["fedga"] == 2 * per_round["fedavg"]


class StateBeforeProbes(NamedTuple):   # RoundState as fljax saved it before probes existed
    round: Any
    key: Any
    params: Any
    server_state: Any
    client_states: Any


def test_a_checkpoint_from_before_probes_restores(tmp_path):
    old = StateBeforeProbes(jnp.int32(3), jax.random.PRNGKey(0), {"w": jnp.arange(3.0)}, (),
                            jnp.ones((2, 3)))
    saved = Checkpoints(str(tmp_path))
    saved.save(3, old, {"seed": 0})
    saved.close()
    like = RoundState(jnp.int32(0), jax.random.PRNGKey(1), {"w": jnp.zeros(3)}, (),
                      jnp.zeros((2, 3)))
    restored = Checkpoints(str(tmp_path)).restore(3, like, {"seed": 0})
    assert isinstance(restored, RoundState) and restored.probes == {}
    assert int(restored.round) == 3
    np.testing.assert_array_equal(restored.params["w"], [0.0, 1.0, 2.0])
