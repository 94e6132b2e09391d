"""Nothing lost: resume equals an uninterrupted run; kills, Ctrl-C and divergence keep checkpoints."""

import glob
import json
import os
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fljax import FljaxError, algorithms
from fljax.runner.checkpoint import Checkpoints, check_same_experiment
from fljax.runner.config import ExperimentConfig
from fljax.runner.experiment import build
from fljax.runner.logs import read_log
from fljax.runner.train import run
from tests.test_logs import scalars

BASE = dict(rounds=8, eval_every=2, checkpoint_every=2, num_clients=10, clients_per_round=4,
            local_epochs=1)


def with_client_memory(alg):
    """FedAvg plus per-client state (last local model, participation count): a stateful client."""

    def client_init(params):
        return {"last": params, "visits": jnp.zeros((), jnp.int32)}

    def client_end(ctx, start, end):
        _, message = alg.client_end(ctx, start, end)
        return {"last": end, "visits": ctx.client_state["visits"] + 1}, message

    return alg._replace(name="fedavg_memory", client_init=client_init, client_end=client_end)


ALGORITHMS = {
    "fedavg": lambda: None,
    "stateful": lambda: with_client_memory(algorithms.fedavg(
        algorithms.local_sgd(0.05), optax.sgd(1.0, momentum=0.9))),
}


def final_state(out_dir, like_config):
    exp = build(like_config)
    ckpts = Checkpoints(out_dir)
    state = ckpts.restore(ckpts.latest_round(), exp.initial_state(), like_config.to_dict())
    ckpts.close()
    return jax.device_get(state)


def records(out_dir):
    """The run's log records without their wall-clock field (time_s): what must be identical."""
    return [{k: v for k, v in r.items() if k != "time_s"}
            for r in read_log(os.path.join(out_dir, "metrics.jsonl"))]


def assert_same(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_half_run_then_resume_is_bit_identical(name, tmp_path):
    alg = ALGORITHMS[name]()
    full = ExperimentConfig(**BASE, out_dir=str(tmp_path / "full"))
    run(full, progress=False, experiment=build(full, alg))
    half = full.replace(out_dir=str(tmp_path / "half"), rounds=4)
    run(half, progress=False, experiment=build(half, alg))
    resumed = half.replace(rounds=8)
    run(resumed, progress=False, experiment=build(resumed, alg))
    state_full = final_state(full.out_dir, full) if alg is None else None
    if alg is None:
        assert_same(state_full, final_state(resumed.out_dir, resumed))
    else:
        exp = build(full, alg)
        got = [Checkpoints(d).restore(8, exp.initial_state(), full.replace(out_dir=d).to_dict())
               for d in (full.out_dir, resumed.out_dir)]
        assert_same(got[0], got[1])
        assert int(np.asarray(got[0].client_states["visits"]).sum()) == 8 * 4
    assert records(full.out_dir) == records(resumed.out_dir)
    assert len([r for r in records(full.out_dir) if r["kind"] == "round"]) == 8


def test_personal_models_resume_bit_identical(tmp_path):
    """Personal models (pFedMe's NamedTuple client state) and the per-user scores of each user's
    own model survive a checkpoint: half a run then its resume equals the whole run."""
    full = ExperimentConfig(**{**BASE, "rounds": 4}, algorithm="pfedme",
                            out_dir=str(tmp_path / "full"), new_users=0.2,
                            user_test_fraction=0.3, finetune_steps=2)
    run(full, progress=False)
    half = full.replace(out_dir=str(tmp_path / "half"), rounds=2)
    run(half, progress=False)
    resumed = half.replace(rounds=4)
    run(resumed, progress=False)
    assert_same(final_state(full.out_dir, full), final_state(resumed.out_dir, resumed))
    assert records(full.out_dir) == records(resumed.out_dir)
    assert "existing_test_acc" in records(full.out_dir)[-1]


def test_a_checkpoint_older_than_a_config_field_resumes_when_the_field_keeps_its_default():
    """A field added after the checkpoint was written counts as its default (the old behaviour)."""
    current = ExperimentConfig(**BASE).to_dict()
    older = {k: v for k, v in current.items() if k != "augment"}
    defaults = ExperimentConfig().to_dict()
    check_same_experiment(older, current, "dir", defaults)
    with pytest.raises(FljaxError, match="different experiment: augment is 'none' there and "
                                         "'flip_crop' here"):
        check_same_experiment(older, {**current, "augment": "flip_crop"}, "dir", defaults)
    with pytest.raises(FljaxError, match="different experiment: augment is None there"):
        check_same_experiment(older, current, "dir")
    # A field saved under its old name (alpha, now dirichlet_alpha) counts under the new one.
    renamed = {("alpha" if k == "dirichlet_alpha" else k): v for k, v in current.items()}
    check_same_experiment(renamed, current, "dir", defaults)
    with pytest.raises(FljaxError, match="dirichlet_alpha is 0.3 there and 0.1 here"):
        check_same_experiment(renamed, {**current, "dirichlet_alpha": 0.1}, "dir", defaults)


def test_restore_into_other_experiment_fails_before_training(tmp_path, capsys):
    config = ExperimentConfig(**BASE, out_dir=str(tmp_path / "r"))
    run(config.replace(rounds=2), progress=False)
    before = records(config.out_dir)
    for change, key in [(dict(model="small_cnn", dataset="digits"), "model"),
                        (dict(lr=0.1), "lr"), (dict(num_clients=12), "num_clients"),
                        (dict(algorithm="fedsgd"), "algorithm")]:
        with pytest.raises(FljaxError, match=f"different experiment: {key} is"):
            other = config.replace(**change)
            run(other, progress=False, experiment=build(config.replace(
                **{k: v for k, v in change.items() if k != "model"})))
        assert records(config.out_dir) == before


def test_fresh_starts_over_deleting_the_checkpoints_and_logs_only(tmp_path):
    config = ExperimentConfig(**BASE, out_dir=str(tmp_path / "r"))
    run(config.replace(rounds=4), progress=False)
    os.makedirs(os.path.join(config.out_dir, "damaged_checkpoints", "3"))
    with open(os.path.join(config.out_dir, "notes.txt"), "w") as f:
        f.write("mine")
    run(config.replace(rounds=2, lr=0.1), progress=False, fresh=True)
    assert Checkpoints(config.out_dir).latest_round() == 2
    assert [r["round"] for r in records(config.out_dir) if r["kind"] == "round"] == [1, 2]
    assert len(os.listdir(os.path.join(config.out_dir, "tb"))) == 1   # the old events are gone
    assert sorted(os.listdir(config.out_dir)) == ["checkpoints", "config.json", "metrics.jsonl",
                                                  "notes.txt", "tb"]
    with open(os.path.join(config.out_dir, "config.json")) as f:
        assert json.load(f)["lr"] == 0.1


def nan_at_round(alg, bad_round):
    def server_update(params, server_state, message, round_index):
        params, server_state = alg.server_update(params, server_state, message, round_index)
        poison = jnp.where(round_index + 1 == bad_round, jnp.nan, 0.0)
        return jax.tree.map(lambda p: p + poison, params), server_state

    return alg._replace(name="poisoned", server_update=server_update)


def test_nan_stops_within_one_round_and_keeps_last_good_checkpoint(tmp_path):
    config = ExperimentConfig(**{**BASE, "checkpoint_every": 2, "eval_every": 100},
                              out_dir=str(tmp_path / "r"))
    alg = nan_at_round(algorithms.fedavg(algorithms.local_sgd(0.05)), bad_round=5)
    with pytest.raises(FljaxError, match=r"round 5: the global model has NaN or Inf parameters "
                                         r"with algorithm 'poisoned'.*last good checkpoint "
                                         r"\(round 4\)"):
        run(config, progress=False, experiment=build(config, alg))
    ckpts = Checkpoints(config.out_dir)
    assert ckpts.latest_round() == 4
    state = ckpts.restore(4, build(config).initial_state(), config.to_dict())
    assert all(np.all(np.isfinite(leaf)) for leaf in jax.tree.leaves(state.params))
    assert [r["round"] for r in records(config.out_dir) if r["kind"] == "round"] == [1, 2, 3, 4]


def test_diverging_learning_rate_exits_2_naming_round_and_algorithm(tmp_path):
    out = subprocess.run([sys.executable, "-m", "fljax", "--lr", "1e6", "--rounds", "4",
                          "--quiet", "--out-dir", str(tmp_path / "r")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    line = out.stderr.strip().splitlines()[-1]
    assert line.startswith("fljax: error: round ") and "algorithm 'fedavg'" in line
    assert "lr=1000000.0" in line


# --- killed and interrupted subprocesses ------------------------------------------------------
# The checkpoint interval (2) does not divide the evaluation interval (5): a kill often falls after
# a checkpoint and before the next evaluation.

CLI = [sys.executable, "-m", "fljax", "--quiet", "--rounds", "16", "--checkpoint-every", "2",
       "--eval-every", "5", "--keep-checkpoints", "2"]


def cli_config(out_dir):
    return ExperimentConfig().replace(rounds=16, checkpoint_every=2, eval_every=5,
                                      keep_checkpoints=2, out_dir=out_dir)


def tensorboard_steps(out_dir):
    """The rounds with a train/loss event in any of the run's TensorBoard event files."""
    return {step for path in glob.glob(os.path.join(out_dir, "tb", "events.out.tfevents.*"))
            for step in scalars(path).get("train/loss", [])}


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
    out_dir = str(tmp_path_factory.mktemp("reference"))
    subprocess.run(CLI + ["--out-dir", out_dir], check=True, capture_output=True, timeout=300)
    return out_dir


def run_until(out_dir, condition, sig):
    """Start the CLI, poll the checkpoint dir every ms, send ``sig`` once ``condition(names)``."""
    proc = subprocess.Popen(CLI + ["--out-dir", out_dir], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    ckpt_dir = os.path.join(out_dir, "checkpoints")
    fired = False
    while proc.poll() is None:
        names = os.listdir(ckpt_dir) if os.path.isdir(ckpt_dir) else []
        if condition(names):
            proc.send_signal(sig)
            fired = True
            break
        time.sleep(0.001)
    _, err = proc.communicate(timeout=300)
    return fired, proc.returncode, err


def saving(names):
    """A later checkpoint is being written (a complete one already exists)."""
    return any("tmp" in n for n in names) and any(n.isdigit() for n in names)


def trained_past_first_checkpoint(names):
    return any(n.isdigit() and int(n) >= 4 for n in names)


def between_save_and_prune(names):
    """A new checkpoint is complete and the oldest of keep + 1 is not yet deleted."""
    return sum(n.isdigit() for n in names) > 2


@pytest.mark.parametrize("moment", [saving, trained_past_first_checkpoint,
                                    between_save_and_prune])
def test_sigkill_keeps_a_restorable_checkpoint_and_resume_matches(moment, tmp_path,
                                                                  reference_run):
    """After a kill, the log and TensorBoard hold every round the latest checkpoint covers; the
    resumed run's checkpoint and log equal an uninterrupted run's (log records compared without
    their wall-clock time_s), and at most keep + 1 checkpoints remain."""
    out_dir = str(tmp_path / "r")
    fired, code, _ = run_until(out_dir, moment, signal.SIGKILL)
    assert fired and code == -signal.SIGKILL
    ckpts = Checkpoints(out_dir)
    latest = ckpts.latest_round()
    assert latest is not None and latest < 16
    config = cli_config(out_dir)
    ckpts.restore(latest, build(config).initial_state(), config.to_dict())
    ckpts.close()
    logged = [r["round"] for r in records(out_dir) if r["kind"] == "round"]
    assert logged[:latest] == list(range(1, latest + 1))
    assert set(range(1, latest + 1)) <= tensorboard_steps(out_dir)
    subprocess.run(CLI + ["--out-dir", out_dir], check=True, capture_output=True, timeout=300)
    assert_same(final_state(reference_run, cli_config(reference_run)),
                final_state(out_dir, config))
    assert records(out_dir) == records(reference_run)
    assert sum(n.isdigit() for n in os.listdir(os.path.join(out_dir, "checkpoints"))) <= 3


def test_ctrl_c_saves_flushes_and_exits_cleanly(tmp_path, reference_run):
    out_dir = str(tmp_path / "r")
    fired, code, err = run_until(out_dir, lambda n: "2" in n, signal.SIGINT)
    assert fired and code == 130, err[-2000:]
    assert "Traceback" not in err and "interrupted after round" in err
    stopped = int(err.split("interrupted after round ")[1].split(";")[0])
    assert Checkpoints(out_dir).latest_round() == stopped
    logged = records(out_dir)
    assert [r["round"] for r in logged if r["kind"] == "round"] == list(range(1, stopped + 1))
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        assert all(json.loads(line) for line in f)
    subprocess.run(CLI + ["--out-dir", out_dir], check=True, capture_output=True, timeout=300)
    assert_same(final_state(reference_run, cli_config(reference_run)),
                final_state(out_dir, cli_config(out_dir)))
    assert records(out_dir) == records(reference_run)


# Ctrl-C at a chosen moment of start-up: MODULE.NAME sends it to its own process when called.
INTERRUPT_AT = """
import importlib, os, signal, sys
from fljax.runner.cli import main

module, name = importlib.import_module(sys.argv[1]), sys.argv[2]
original = getattr(module, name)
def interrupted(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGINT)
    return original(*args, **kwargs)
setattr(module, name, interrupted)
sys.exit(main(sys.argv[3:]))
"""


# Ctrl-C the moment jax starts importing (the first seconds of any fljax command).
INTERRUPT_AT_JAX_IMPORT = """
import os, signal, sys

class Interrupt:
    def find_spec(self, name, path=None, target=None):
        if name == "jax":
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, Interrupt())
from fljax.runner.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_ctrl_c_while_jax_imports_exits_130_with_one_line(tmp_path):
    """``import fljax`` and the CLI module import no heavy module, so the CLI's handler is in
    place before jax, orbax and tensorflow-datasets load: exit 130, one line, nothing written."""
    out_dir = str(tmp_path / "r")
    out = subprocess.run([sys.executable, "-c", INTERRUPT_AT_JAX_IMPORT, *CLI[3:],
                          "--out-dir", out_dir], capture_output=True, text=True, timeout=300)
    assert out.returncode == 130, out.stderr[-2000:]
    assert out.stderr.strip() == "fljax: interrupted during start-up; nothing was written"
    assert not os.path.exists(out_dir)


@pytest.mark.parametrize("module, name, message", [
    ("fljax.data.loaders", "load_dataset", "interrupted during start-up; nothing was written"),
    ("fljax.runner.train", "RunLog",
     "interrupted before the first round; run the same command again to start"),
], ids=["while the data loads", "after the run directory appears"])
def test_ctrl_c_during_start_up_exits_130_with_one_line(module, name, message, tmp_path):
    """Before the run directory is touched Ctrl-C exits at once; from the first write on the run
    stops before its first round. Either way: exit code 130, one line, no traceback."""
    out_dir = str(tmp_path / "r")
    out = subprocess.run([sys.executable, "-c", INTERRUPT_AT, module, name, *CLI[3:],
                          "--out-dir", out_dir], capture_output=True, text=True, timeout=300)
    assert out.returncode == 130, out.stderr[-2000:]
    assert out.stderr.strip() == f"fljax: {message}"
    if module == "fljax.data.loaders":
        assert not os.path.exists(out_dir)
    else:
        assert Checkpoints(out_dir).latest_round() is None and records(out_dir) == []
