"""--init-from: a run starts from the global model of another run's newest checkpoint (shapes
checked, layers in --init-reset keep their own initialization); bad input is one line, exit 2."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from fljax import FljaxError
from fljax.runner.checkpoint import Checkpoints, saved_params
from fljax.runner.cli import main
from fljax.runner.config import ExperimentConfig
from fljax.runner.experiment import batch_memory, build, build_batch
from fljax.runner.train import run, run_many
from tests.xla_build import xla_flags

BASE = dict(rounds=2, eval_every=2, checkpoint_every=2, num_clients=10, clients_per_round=4,
            local_epochs=1)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A 2-round digits run with its checkpoint, and its final params (restored as resume does)."""
    config = ExperimentConfig(**BASE, out_dir=str(tmp_path_factory.mktemp("src") / "run"))
    run(config, progress=False)
    checkpoints = Checkpoints(config.out_dir)
    state = checkpoints.restore(2, build(config).initial_state(), config.to_dict())
    checkpoints.close()
    return config, jax.device_get(state.params)


def test_a_run_starts_from_the_other_runs_newest_params(source, tmp_path):
    config, trained = source
    other = config.replace(init_from=config.out_dir, seed=5, out_dir=str(tmp_path / "b"))
    start = jax.device_get(build(other).initial_state().params)
    for a, b in zip(jax.tree.leaves(start), jax.tree.leaves(trained), strict=True):
        np.testing.assert_array_equal(a, b)
    own = jax.device_get(build(other.replace(init_from=None)).initial_state().params)
    assert not np.array_equal(jax.tree.leaves(own)[0], jax.tree.leaves(trained)[0])
    evaluations = run(other.replace(rounds=1, eval_every=1), progress=False)
    assert 0.0 <= evaluations[-1]["accuracy"] <= 1.0


def test_a_batch_of_runs_starts_from_the_saved_params(source, tmp_path):
    """Seeds of an --init-from cell in one program (a sweep's batch, whose memory estimate traces
    the initial state): every run starts from the saved model and trains."""
    config, trained = source
    configs = [config.replace(init_from=config.out_dir, seed=s, rounds=1, eval_every=1,
                              out_dir=str(tmp_path / f"s{s}")) for s in (5, 6)]
    batch = build_batch(configs)
    assert batch_memory(batch.experiments[0], 2, 1)[0] > 0
    start = jax.device_get(batch.initial_state().params)
    for a, b in zip(jax.tree.leaves(start), jax.tree.leaves(trained), strict=True):
        np.testing.assert_array_equal(a, np.stack([b, b]))
    results = run_many(configs, progress=False, say=lambda text: None)
    assert all(0.0 <= r[-1]["accuracy"] <= 1.0 for r in results)


def test_init_reset_layers_keep_their_own_initialization(source, tmp_path):
    config, trained = source
    other = config.replace(init_from=config.out_dir, init_reset="fc3", seed=5)
    start = jax.device_get(build(other).initial_state().params)
    own = jax.device_get(build(other.replace(init_from=None, init_reset="")).initial_state()
                         .params)
    assert sorted(start) == ["fc1", "fc2", "fc3"]
    for name in start:
        expected = own[name] if name == "fc3" else trained[name]
        for a, b in zip(jax.tree.leaves(start[name]), jax.tree.leaves(expected), strict=True):
            np.testing.assert_array_equal(a, b)


def test_another_models_checkpoint_is_refused_with_the_layer_named(source):
    config, _ = source
    like = jax.eval_shape(build(config.replace(model="mlp_bn")).model.init, jax.random.key(0))
    with pytest.raises(FljaxError, match="has no parameter 'bn1/bias': it is another model"):
        saved_params(config.out_dir, like)
    wider = build(config).model
    like = jax.tree.map(lambda a: a, jax.eval_shape(wider.init, jax.random.key(0)))
    like["fc1"]["kernel"] = jax.ShapeDtypeStruct((64, 100), like["fc1"]["kernel"].dtype)
    with pytest.raises(FljaxError, match=r"'fc1/kernel' is \(64, 200\) float32 there and "
                                         r"\(64, 100\) float32 here"):
        saved_params(config.out_dir, like)


@pytest.mark.parametrize("flags, message", [
    (["--init-from", "{missing}"], "has no checkpoint"),
    (["--init-from", "{source}", "--model", "mlp_bn"], "has no parameter 'bn1/bias'"),
    (["--init-from", "{source}", "--init-reset", "head"], "init_reset ['head'] are not top-level "
                                                          "layers of the model"),
    (["--init-reset", "fc3"], "init_reset needs init_from"),
    (["--init-from", "{source}", "--pretrained", "x.npz"], "set one of init_from and pretrained"),
])
def test_bad_init_from_is_one_line_and_exit_2(source, flags, message, tmp_path, capsys):
    config, _ = source
    flags = [f.format(missing=str(tmp_path / "nothing"), source=config.out_dir) for f in flags]
    code = main(["--rounds", "1", "--num-clients", "10", "--clients-per-round", "4",
                 "--out-dir", str(tmp_path / "r"), "--quiet", *flags])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and message in err, err


def test_cli_seeds_from_saved_params_spread_over_two_devices(source, tmp_path):
    """`fljax --init-from RUN --seeds 5-6` in a fresh process: the CLI makes one CPU device per
    core and spreads the two runs over two devices, which the saved params (read on one device)
    must not pin (the params themselves: test_a_batch_of_runs_starts_from_the_saved_params)."""
    config, _ = source
    out = tmp_path / "seeds"
    env = {**os.environ, "XLA_FLAGS": xla_flags("--xla_force_host_platform_device_count=2")}
    done = subprocess.run(
        [sys.executable, "-m", "fljax", "--init-from", config.out_dir, "--seeds", "5-6",
         "--rounds", "1", "--eval-every", "1", "--num-clients", "10", "--clients-per-round", "4",
         "--local-epochs", "1", "--out-dir", str(out), "--quiet"],
        env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "on 2 device(s)" in done.stdout + done.stderr
    logs = sorted(out.glob("**/metrics.jsonl"))
    assert len(logs) == 2
    for log in logs:
        evaluations = [json.loads(line) for line in log.read_text().splitlines()
                       if json.loads(line)["kind"] == "eval"]
        assert len(evaluations) == 1 and 0.0 <= evaluations[0]["accuracy"] <= 1.0
