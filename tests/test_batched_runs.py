"""Batched runs from the command line and in sweeps: each run's files are those of the run alone,
a killed batched sweep resumes to the same table, and which cells share a program."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from fljax.runner import grouping

from fljax.runner import sweep
from fljax.runner.cli import main
from fljax.runner.config import ExperimentConfig
from fljax.runner.train import run
from tests.test_resume import records

TINY = ["--rounds", "4", "--eval-every", "2", "--checkpoint-every", "2", "--quiet",
        "--num-clients", "7", "--clients-per-round", "3", "--local-steps", "2",
        "--validation-fraction", "0.1", "--new-users", "0.2", "--user-test-fraction", "0.2",
        "--finetune-steps", "2"]


def without_time(lines):
    return [{k: v for k, v in line.items() if k != "time_s"} for line in lines]


def test_a_grid_of_seeds_and_lrs_trains_in_one_program_and_equals_each_run_alone(tmp_path):
    """In a child process (two CPU devices: the runs are spread over both), 2 lrs x 2 seeds with
    a validation split, personalized evaluation of new and existing users and an evaluation probe
    (each run scored with its own values): every run's log equals the same run alone (one
    device, its own program), checkpoints and config per run, and the table."""
    out = tmp_path / "grid"
    done = subprocess.run([sys.executable, "-m", "fljax", *TINY, "--out-dir", str(out),
                           "--seeds", "0-1", "--set", "lr=0.05,0.2", "--probes", "all_model"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "4 runs in one program on 2 device(s)" in done.stdout
    assert "| lr=0.05 | 2 |" in done.stdout and "| lr=0.2 | 2 |" in done.stdout
    assert (out / "results.md").read_text().strip() in done.stdout
    config = ExperimentConfig().replace(**{
        "rounds": 4, "eval_every": 2, "checkpoint_every": 2, "num_clients": 7,
        "clients_per_round": 3, "local_steps": 2, "local_epochs": None,
        "validation_fraction": 0.1, "new_users": 0.2, "user_test_fraction": 0.2,
        "finetune_steps": 2, "lr": 0.2, "seed": 1, "probes": "all_model",
        "out_dir": str(tmp_path / "alone")})
    run(config, progress=False)
    batched = out / "lr_0.2" / "seed_1"
    assert without_time(records(str(batched))) == without_time(records(config.out_dir))
    assert {"new_test_acc", "all_model/accuracy"} <= set(records(config.out_dir)[-1])
    assert json.loads((batched / "config.json").read_text())["lr"] == 0.2
    assert sorted(os.listdir(batched / "checkpoints")) == ["2", "4"]


SPEC = {
    "title": "tiny", "base": {"num_clients": 6, "clients_per_round": 3, "local_steps": 2,
                              "local_epochs": None, "rounds": 4, "eval_every": 2,
                              "checkpoint_every": 2, "validation_fraction": 0.1,
                              "grid": {"lr": [0.05, 0.2]}},
    "rows": {"Dir 0.3": {}}, "seeds": [0, 1],
    "columns": {"FedAvg": {"algorithm": "fedavg"},
                "FedProx": {"algorithm": "fedprox", "algorithm_args": {"mu": 0.01}},
                "FedProx mu 0.1": {"algorithm": "fedprox", "algorithm_args": {"mu": 0.1}}},
    "compare": [["FedProx", "FedAvg"]],
}


def test_a_killed_batched_sweep_resumes_to_the_tables_of_an_uninterrupted_one(tmp_path):
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(SPEC))
    assert main(["sweep", str(path), "--out-dir", str(tmp_path / "whole"), "--quiet"]) == 0
    whole = (tmp_path / "whole" / "base" / "results.md").read_text()
    killed = tmp_path / "killed"
    child = subprocess.Popen([sys.executable, "-m", "fljax", "sweep", str(path), "--out-dir",
                              str(killed), "--quiet"], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 240
    while time.time() < deadline and child.poll() is None and not any(
            "checkpoints" in root and root.endswith("/2") for root, _, _ in os.walk(killed)):
        time.sleep(0.05)
    os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    assert not (killed / "base" / "results.md").exists(), "the sweep finished before the kill"
    assert main(["sweep", str(path), "--out-dir", str(killed), "--quiet"]) == 0
    assert (killed / "base" / "results.md").read_text() == whole
    for cell in sweep.cells(SPEC, None, str(tmp_path / "whole")):
        mine = cell.config.out_dir.replace(str(tmp_path / "whole"), str(killed))
        assert without_time(records(mine)) == without_time(records(cell.config.out_dir))


def test_cells_share_a_program_when_they_differ_in_traced_values_and_data(tmp_path):
    cells = sweep.cells(SPEC, None, str(tmp_path))
    groups = grouping.group([c.config for c in cells], most=100)
    names = [sorted({cells[i].column for i in g}) for g in groups]
    # FedProx's mu and every lr are traced, seeds are data: two programs for 12 runs
    assert names == [["FedAvg"], ["FedProx", "FedProx mu 0.1"]]
    assert [len(g) for g in groups] == [4, 8]
    assert grouping.traced_keys([cells[i].config for i in groups[1]]) == [
        "algorithm_args.mu", "lr"]
    assert [len(g) for g in grouping.group([c.config for c in cells], most=3)] == [3, 1, 3, 3,
                                                                                 2]
    base = cells[0].config
    for change in (dict(local_steps=3), dict(model="linear"), dict(clip_norm=1.0),
                   dict(aggregation="uniform"), dict(switch_to="fedavg", switch_at=3)):
        assert grouping.structure(base.replace(**change)) != grouping.structure(base), change
    for change in (dict(seed=7), dict(lr=0.3), dict(dirichlet_alpha=0.1), dict(rounds=9),
                   dict(momentum=0.5), dict(out_dir="elsewhere")):
        assert grouping.structure(base.replace(**change)) == grouping.structure(base), change
    noisy = base.replace(client_noise=0.1)        # each run's images are its own
    assert grouping.structure(noisy) != grouping.structure(noisy.replace(seed=9))
    switched = base.replace(switch_to="fedavg", switch_at=3, switch_lr=0.01)
    assert grouping.structure(switched.replace(switch_lr=0.02, switch_at=5)) == \
        grouping.structure(switched) != grouping.structure(switched.replace(switch_lr=None))
    sharded = base.replace(num_devices=2)
    assert grouping.structure(sharded) != grouping.structure(sharded.replace(seed=5))


def test_a_run_resumes_whatever_runs_shared_its_program(tmp_path):
    """A checkpoint holds the run's traced values as its program had them (only those that
    differed among its runs): the run resumes in a program of other runs, and alone, exactly
    as the same run trained straight through alone."""
    spec = {**SPEC, "seeds": [0], "compare": [], "columns": {
        name: SPEC["columns"][name] for name in ("FedProx", "FedProx mu 0.1")}}
    path, out = tmp_path / "tiny.json", tmp_path / "sweep"
    path.write_text(json.dumps(spec))
    assert main(["sweep", str(path), "--out-dir", str(out), "--quiet"]) == 0   # mu and lr traced
    assert main(["sweep", str(path), "--out-dir", str(out), "--quiet", "--columns", "FedProx",
                 "--set", "rounds=6"]) == 0                                      # lr alone
    cell = next(c for c in sweep.cells(spec, None, str(out))
                if c.column == "FedProx" and c.config.lr == 0.2)
    run(cell.config.replace(rounds=8), progress=False)                          # nothing traced
    straight = cell.config.replace(rounds=8, out_dir=str(tmp_path / "alone"))
    run(straight, progress=False)
    assert without_time(records(cell.config.out_dir)) == without_time(records(straight.out_dir))
    assert [r["round"] for r in records(straight.out_dir) if r["kind"] == "eval"] == [2, 4, 6, 8]
