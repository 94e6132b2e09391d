"""Bad input of every kind: exit code 2, one line naming the problem, nothing written is lost.

Every case runs the CLI against a copy of a finished run directory (checkpoints, log, config) and
checks that the directory's files are byte-identical afterwards.
"""

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import pytest

from fljax.runner.checkpoint import Checkpoints
from fljax.runner.cli import main
from fljax.runner.config import ExperimentConfig
from tests.test_resume import assert_same, final_state, records

RUN = ["--rounds", "2", "--checkpoint-every", "1", "--eval-every", "1", "--quiet"]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("finished") / "run")
    assert main(RUN + ["--out-dir", out]) == 0
    return out


def snapshot(directory):
    digests = {}
    for root, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                digests[os.path.relpath(path, directory)] = hashlib.sha256(f.read()).hexdigest()
    return digests


def npz(tmp, **changes):
    rng = np.random.default_rng(0)
    arrays = dict(x_train=rng.random((60, 8, 8, 1), np.float32), y_train=np.arange(60) % 3,
                  x_test=rng.random((12, 8, 8, 1), np.float32), y_test=np.arange(12) % 3)
    arrays.update(changes)
    path = os.path.join(tmp, "data.npz")
    np.savez(path, **arrays)
    return path


def truncated_npz(tmp):
    path = npz(tmp)
    os.truncate(path, os.path.getsize(path) // 2)
    return path


def state_files(run_dir, round_index):
    """The files holding a checkpoint's state."""
    return [os.path.join(root, name) for root, _, files in
            os.walk(os.path.join(run_dir, "checkpoints", str(round_index), "state"))
            for name in files]


def corrupt_checkpoints(run_dir, tmp):
    for round_index in (1, 2):
        for path in state_files(run_dir, round_index):
            with open(path, "wb") as f:
                f.write(b"\x00garbage")


def checkpoints_a_file(run_dir, tmp):
    shutil.rmtree(os.path.join(run_dir, "checkpoints"))
    with open(os.path.join(run_dir, "checkpoints"), "w") as f:
        f.write("not a directory")


def damage_log(run_dir, tmp):
    path = os.path.join(run_dir, "metrics.jsonl")
    with open(path, "rb") as f:
        lines = f.readlines()
    lines[1] = lines[1][:20] + b"\xff\xfe" + lines[1][20:]   # not UTF-8
    with open(path, "wb") as f:
        f.writelines(lines)


def foreign_checkpoint(run_dir, tmp):
    shutil.rmtree(os.path.join(run_dir, "checkpoints"))
    os.makedirs(os.path.join(run_dir, "checkpoints", "7", "something"))
    with open(os.path.join(run_dir, "checkpoints", "7", "something", "data.bin"), "wb") as f:
        f.write(os.urandom(64))


def bad_config_file(tmp, text):
    path = os.path.join(tmp, "c.json")
    with open(path, "w") as f:
        f.write(text)
    return path


# (id, argv builder taking a tmp dir, expected message part(s), optional run-dir mutation)
CASES = [
    ("negative lr", lambda t: ["--lr", "-0.1"], "lr must be > 0, got -0.1"),
    ("zero server lr", lambda t: ["--server-lr", "0"], "server_lr must be > 0"),
    ("cohort > clients", lambda t: ["--clients-per-round", "30"],
     "clients_per_round (30) must be <= num_clients (20)"),
    ("no clients", lambda t: ["--num-clients", "0"], "num_clients must be an integer >= 1, got 0"),
    ("zero rounds", lambda t: ["--rounds", "0"], "rounds must be an integer >= 1, got 0"),
    ("zero eval interval", lambda t: ["--eval-every", "0"], "eval_every must be an integer >= 1"),
    ("zero checkpoint interval", lambda t: ["--checkpoint-every", "0"], "checkpoint_every must"),
    ("keep no checkpoints", lambda t: ["--keep-checkpoints", "0"], "keep_checkpoints must"),
    ("unknown algorithm", lambda t: ["--algorithm", "fedfoo"],
     ("unknown algorithm 'fedfoo'", "an import path 'module:algorithm'")),
    ("unknown partition", lambda t: ["--partition", "zipf"], "partition must be one of"),
    ("unknown augmentation", lambda t: ["--augment", "mixup"], "augment must be one of"),
    ("unknown model", lambda t: ["--model", "resnet1"], "unknown model 'resnet1'"),
    ("cnn on 8x8 digits", lambda t: ["--model", "small_cnn"], "at least 13x13"),
    ("negative Dirichlet alpha", lambda t: ["--dirichlet-alpha", "-1"],
     "dirichlet_alpha must be > 0"),
    ("lr decay > 1", lambda t: ["--lr-decay", "1.5"], "lr_decay must be in (0, 1]"),
    ("momentum 1", lambda t: ["--momentum", "1.0"], "momentum must be in [0, 1)"),
    ("negative weight decay", lambda t: ["--weight-decay", "-1"], "weight_decay must be >= 0"),
    ("zero clip norm", lambda t: ["--clip-norm", "0"], "clip_norm must be > 0"),
    ("negative batch", lambda t: ["--batch-size", "-2"], "batch_size must be >= 1"),
    ("zero local steps", lambda t: ["--local-steps", "0"], "local_steps / local_epochs must be"),
    ("unknown aggregation", lambda t: ["--aggregation", "median"], "aggregation must be one of"),
    ("new users without a test split", lambda t: ["--new-users", "0.2"],
     "need user_test_fraction > 0"),
    ("cohort > existing users", lambda t: ["--user-test-fraction", "0.2", "--new-users", "0.5",
                                           "--clients-per-round", "15"],
     "clients_per_round (15) must be <= the 10 existing users"),
    ("unknown server optimizer", lambda t: ["--server-optimizer", "adamm"],
     "unknown server optimizer 'adamm'"),
    ("server args not JSON", lambda t: ["--server-optimizer-args", "{momentum: 0.9}"],
     "server_optimizer_args must be a JSON"),
    ("server args not accepted", lambda t: ["--server-optimizer-args", '{"nesterovv": true}'],
     "does not take"),
    ("too many devices", lambda t: ["--num-devices", "64"], "num_devices must be in"),
    ("no processes", lambda t: ["--num-processes", "0"], "num_processes must be an integer >= 1"),
    ("process id out of range", lambda t: ["--num-processes", "2", "--process-id", "2"],
     "process_id must be an integer in [0, 1], got 2"),
    ("processes without a coordinator", lambda t: ["--num-processes", "2"],
     "coordinator_address must be 'host:port'"),
    ("unknown conv", lambda t: ["--conv-impl", "cudnn"], "conv_impl must be one of"),
    ("more clients than examples", lambda t: ["--num-clients", "2000",
                                              "--clients-per-round", "10"],
     "num_clients (2000) must be <="),
    ("unreachable min size", lambda t: ["--min-size", "500"], "min_size"),
    ("partition leaves a client empty", lambda t: ["--min-size", "0", "--dirichlet-alpha",
                                                   "0.001", "--num-clients", "200"],
     "empty"),
    ("missing config file", lambda t: ["--config", "/nonexistent.json"], "does not exist"),
    ("config file not JSON", lambda t: ["--config", bad_config_file(t, "{rounds: 3")],
     "not valid JSON"),
    ("config value of wrong type", lambda t: ["--config", bad_config_file(t, '{"lr": "fast"}')],
     "lr must be of type float"),
    ("unknown config key", lambda t: ["--config", bad_config_file(t, '{"roundz": 3}')],
     "unknown config key(s) ['roundz']"),
    ("tfds dataset without data dir", lambda t: ["--dataset", "mnist"], "--data-dir"),
    ("tfds dataset missing offline", lambda t: ["--dataset", "mnist", "--data-dir", t],
     "tfds build mnist"),
    ("unknown tfds dataset", lambda t: ["--dataset", "no_such_dataset", "--data-dir", t],
     "no_such_dataset"),
    ("npz features of wrong rank", lambda t: ["--dataset", npz(t, x_train=np.zeros((60, 64)))],
     "must be [N, H, W] or [N, H, W, C]"),
    ("npz lengths differ", lambda t: ["--dataset", npz(t, y_train=np.arange(59) % 3)],
     "different lengths (60 vs 59)"),
    ("npz negative labels", lambda t: ["--dataset", npz(t, y_train=np.arange(60) % 3 - 1)],
     "negative labels"),
    ("npz test label out of range", lambda t: ["--dataset", npz(t, y_test=np.arange(12) % 5)],
     "not seen in y_train"),
    ("npz float labels", lambda t: ["--dataset", npz(t, y_train=np.zeros(60))],
     "1-D integer array"),
    ("npz NaN features", lambda t: ["--dataset", npz(t, x_train=np.full((60, 8, 8, 1), np.nan,
                                                                         np.float32))],
     "NaN or Inf"),
    ("npz missing array", lambda t: ["--dataset", os.path.join(t, "none.npz")],
     "does not exist"),
    ("fedprox negative mu", lambda t: ["--algorithm", "fedprox", "--algorithm-args",
                                       '{"mu": -0.1}'], "mu must be >= 0"),
    ("feddyn zero alpha", lambda t: ["--algorithm", "feddyn", "--algorithm-args", '{"alpha": 0}'],
     "alpha must be > 0"),
    ("fedsam negative rho", lambda t: ["--algorithm", "fedsam", "--algorithm-args",
                                       '{"rho": -1}'], "rho must be a finite number >= 0"),
    ("fedadam zero tau", lambda t: ["--algorithm", "fedadam", "--algorithm-args", '{"tau": 0}'],
     "tau must be > 0"),
    ("unknown hyperparameter", lambda t: ["--algorithm", "scaffold", "--algorithm-args",
                                          '{"muu": 1}'], "does not take ['muu']"),
    ("server lr in algorithm args", lambda t: ["--algorithm", "fedavgm", "--algorithm-args",
                                               '{"server_lr": 0.5}'],
     "algorithm 'fedavgm' takes server_lr from --server-lr (server_lr in the config), not from "
     "--algorithm-args"),
    ("local lr in switch args", lambda t: ["--algorithm", "feddyn", "--switch-to", "fedavg",
                                           "--switch-at", "1", "--switch-args", '{"lr": 0.1}'],
     "algorithm 'fedavg' takes lr from --switch-lr (switch_lr in the config), not from "
     "--switch-args"),
    ("local lr in wrapper args", lambda t: ["--wrappers", '{"relaxed_init": {"beta": 0.1, '
                                            '"lr": 0.1}}'],
     "wrapper 'relaxed_init' takes lr from --lr (lr in the config), not from --wrappers"),
    ("algorithm args not an object", lambda t: ["--algorithm-args", "[1]"],
     "algorithm_args must be a JSON object"),
    ("unknown switch target", lambda t: ["--algorithm", "feddyn", "--switch-to", "fedfoo"],
     "unknown algorithm 'fedfoo'"),
    ("negative switch round", lambda t: ["--switch-to", "fedavg", "--switch-at", "-3"],
     "switch_at must be >= 0"),
    ("unknown wrapper", lambda t: ["--wrappers", '{"fedbugg": {}}'], "unknown wrapper(s)"),
    ("wrapper missing its beta", lambda t: ["--wrappers", '{"relaxed_init": {}}'],
     "wrapper 'relaxed_init' needs ['beta']"),
    ("FedBug fraction above 1", lambda t: ["--wrappers",
                                           '{"gradual_unfreezing": {"fraction": 1.5}}'],
     "fraction"),
    ("FedDecay without beta", lambda t: ["--algorithm", "feddecay"],
     "algorithm 'feddecay' needs ['beta']"),
    ("other experiment's checkpoint", lambda t: ["--lr", "0.2"],
     ("different experiment: lr", "use --out-dir NEW for a new run in a new directory, or "
      "--fresh to delete this directory's checkpoints and logs")),
    ("negative seed", lambda t: ["--seed", "-1"], "seed must be an integer in [0, 4294967295]"),
    ("batch larger than the data", lambda t: ["--batch-size", "2000000000"],
     "batch_size (2000000000) must be <= the number of training examples (1437)"),
    ("NaN momentum", lambda t: ["--momentum", "nan"], "momentum must be a finite number, got nan"),
    ("infinite weight decay", lambda t: ["--weight-decay", "inf"],
     "weight_decay must be a finite number, got inf"),
    ("NaN clip norm", lambda t: ["--clip-norm", "nan"], "clip_norm must be a finite number"),
    ("hyperparameter of the wrong type", lambda t: ["--algorithm", "feddyn", "--algorithm-args",
                                                    '{"alpha": "0.1"}'],
     "algorithm 'feddyn': alpha must be a number, got \"0.1\""),
    ("NaN hyperparameter", lambda t: ["--algorithm", "fedprox", "--algorithm-args",
                                      '{"mu": NaN}'], "mu must be a finite number, got nan"),
    ("server optimizer arg of the wrong type", lambda t: ["--server-optimizer-args",
                                                          '{"momentum": "0.9"}'],
     "server optimizer 'sgd': momentum must be a number or null, got \"0.9\""),
    ("wrapper arg of the wrong type", lambda t: ["--wrappers",
                                                 '{"relaxed_init": {"beta": [0.1]}}'],
     "wrapper 'relaxed_init': beta must be a number"),
    ("truncated npz", lambda t: ["--dataset", truncated_npz(t)], "is not a readable .npz file"),
    ("npz label far beyond the classes", lambda t: [
        "--dataset", npz(t, y_train=np.where(np.arange(60) == 0, 10**9, np.arange(60) % 3)),
        "--num-clients", "5", "--clients-per-round", "5"],
     "has label 1000000000: labels must be class indices 0..C-1"),
    ("argparse type error", lambda t: ["--lr", "abc"], "argument --lr: invalid float value: 'abc'"),
    ("server lr set twice", lambda t: ["--server-optimizer-args", '{"learning_rate": 0.1}'],
     "server_optimizer_args sets learning_rate (0.1), which --server-lr sets; give it once"),
    ("bad seed range", lambda t: ["--seeds", "0-x"], "--seeds takes integers and ranges"),
    ("repeated seeds", lambda t: ["--seeds", "1,1"], "--seeds must name distinct seeds"),
    ("grid without values", lambda t: ["--set", "lr"], "--set takes KEY=VALUE[,VALUE...]"),
    ("grid of a bad value", lambda t: ["--seeds", "0", "--set", "lr=0.1,-1"],
     "lr must be > 0, got -1"),
    ("no runs per program", lambda t: ["--seeds", "0-1", "--max-runs", "0"],
     "--max-runs must be >= 1, got 0"),
]
MUTATING = [
    ("every checkpoint corrupt", lambda t: [], ("checkpoint 2 in", "is damaged"),
     corrupt_checkpoints),
    ("foreign checkpoint dir", lambda t: [], ("checkpoint 7 in", "is damaged"),
     foreign_checkpoint),
    ("checkpoints a plain file", lambda t: [], "checkpoints' is not a directory",
     checkpoints_a_file),
    ("non-UTF-8 bytes in the log", lambda t: [], ("line 2 of", "metrics.jsonl' is damaged"),
     damage_log),
]


@pytest.mark.parametrize("case", CASES + MUTATING, ids=[c[0] for c in CASES + MUTATING])
def test_bad_input_exits_2_with_one_line_and_loses_nothing(case, finished_run, tmp_path, capsys):
    _, argv, message, *mutate = case
    run_dir = str(tmp_path / "run")
    shutil.copytree(finished_run, run_dir)
    if mutate:
        mutate[0](run_dir, str(tmp_path))
    before = snapshot(run_dir)
    code = main(RUN + argv(str(tmp_path)) + ["--out-dir", run_dir])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1, err
    assert err.startswith("fljax: error: "), err
    assert all(part in err for part in ((message,) if isinstance(message, str) else message)), err
    assert snapshot(run_dir) == before


def truncate_state_files(run_dir, round_index):
    for path in state_files(run_dir, round_index):
        os.truncate(path, os.path.getsize(path) // 2)


def test_damaged_checkpoints_give_one_line_even_from_orbax_background_reads(finished_run,
                                                                            tmp_path):
    """Truncated array files: orbax abandons reads still in flight; their reports, which come
    from background threads after the error, must not reach stderr."""
    run_dir = str(tmp_path / "run")
    shutil.copytree(finished_run, run_dir)
    for round_index in (1, 2):
        truncate_state_files(run_dir, round_index)
    out = subprocess.run([sys.executable, "-m", "fljax", *RUN, "--out-dir", run_dir],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr[-3000:]
    assert "checkpoint 2 in" in out.stderr and "is damaged" in out.stderr


def truncate_largest_array_file(run_dir, round_index):
    """Cut the largest file of a checkpoint's state in half: its array data."""
    largest = max(state_files(run_dir, round_index), key=os.path.getsize)
    os.truncate(largest, os.path.getsize(largest) // 2)


@pytest.mark.parametrize("damage, damaged_round", [
    (lambda run_dir: os.makedirs(os.path.join(run_dir, "checkpoints", "99")), 99),
    (lambda run_dir: truncate_largest_array_file(run_dir, 2), 2),
    (lambda run_dir: truncate_state_files(run_dir, 2), 2),
], ids=["empty newest checkpoint", "array data cut in half", "every state file cut"])
def test_damaged_newest_checkpoint_is_set_aside_in_one_line_and_the_run_resumes(
        damage, damaged_round, finished_run, tmp_path):
    """Through the CLI: stderr is fljax's one warning line (no line of orbax's logging, no report
    of the reads it abandons), and the run resumes from the newest intact checkpoint to the
    uninterrupted run's state and log."""
    run_dir = str(tmp_path / "run")
    shutil.copytree(finished_run, run_dir)
    damage(run_dir)
    done = subprocess.run([sys.executable, "-m", "fljax", *RUN, "--out-dir", run_dir],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    err = done.stderr.splitlines()
    assert len(err) == 1, done.stderr[-3000:]
    assert err[0].startswith(f"fljax: warning: checkpoint {damaged_round} in")
    assert "is damaged" in err[0] and "resuming from checkpoint" in err[0]
    assert os.listdir(os.path.join(run_dir, "damaged_checkpoints")) == [str(damaged_round)]
    assert Checkpoints(run_dir).latest_round() == 2
    config = ExperimentConfig().replace(rounds=2, checkpoint_every=1, eval_every=1)
    assert_same(final_state(finished_run, config.replace(out_dir=finished_run)),
                final_state(run_dir, config.replace(out_dir=run_dir)))
    assert records(run_dir) == records(finished_run)


def test_a_cut_metadata_file_that_orbax_reads_past_resumes_without_a_line(finished_run,
                                                                        tmp_path):
    """Orbax logs an error for an unparsable _CHECKPOINT_METADATA and restores the checkpoint
    anyway: nothing is lost, so nothing is printed."""
    run_dir = str(tmp_path / "run")
    shutil.copytree(finished_run, run_dir)
    os.truncate(os.path.join(run_dir, "checkpoints", "2", "_CHECKPOINT_METADATA"), 50)
    done = subprocess.run([sys.executable, "-m", "fljax", *RUN, "--rounds", "3", "--out-dir",
                           run_dir], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stderr == "", done.stderr[-3000:]
    assert [r["round"] for r in records(run_dir) if r["kind"] == "round"] == [1, 2, 3]


@contextlib.contextmanager
def read_only(directory):
    """``directory`` made read-only: by its mode, or for root (whom modes do not stop) with
    ``chattr +i``; skips the test where neither works."""

    def writable():
        try:
            with tempfile.TemporaryFile(dir=directory):
                return True
        except OSError:
            return False

    os.chmod(directory, 0o555)
    immutable = False
    try:
        if writable() and shutil.which("chattr"):
            immutable = subprocess.run(["chattr", "+i", directory],
                                       capture_output=True).returncode == 0
        if writable():
            pytest.skip("cannot make a directory read-only here")
        yield
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", directory], check=True)
        os.chmod(directory, 0o755)


def test_read_only_checkpoint_dir_fails_before_training(finished_run, tmp_path, capsys):
    """Resuming into a checkpoint dir that cannot be written fails at once, not at the first
    save after a round was trained and logged."""
    run_dir = str(tmp_path / "run")
    shutil.copytree(finished_run, run_dir)
    before = snapshot(run_dir)
    with read_only(os.path.join(run_dir, "checkpoints")):
        code = main(RUN + ["--rounds", "3", "--out-dir", run_dir])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("fljax: error: checkpoint dir") and "is not writable" in err
    assert snapshot(run_dir) == before


def test_unwritable_out_dir(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(RUN + ["--out-dir", str(blocker / "sub")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is not writable" in err
    assert blocker.read_text() == "x"


def test_at_least_thirty_cases():
    assert len(CASES) + len(MUTATING) + 1 >= 30


def test_plot_of_non_run_directory_exits_2(tmp_path, capsys):
    assert main(["plot", str(tmp_path)]) == 2
    assert "has no metrics.jsonl records" in capsys.readouterr().err


def test_config_json_is_left_as_the_finished_run_wrote_it(finished_run):
    with open(os.path.join(finished_run, "config.json")) as f:
        assert json.load(f)["rounds"] == 2
