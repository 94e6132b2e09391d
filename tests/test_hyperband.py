"""Hyperband early stopping of a sweep's grid points (fljax.runner.hyperband, Optuna's HyperbandPruner):
weak points stop at a rung and are never selected, the best trains to the end, a rerun replays
the decisions, bad options are one line; end to end through fljax sweep."""

import json

import pytest

from fljax.runner import hyperband

from fljax.runner import sweep
from fljax.runner.cli import main
from fljax.errors import FljaxError

LRS = [0.001, 0.3, 0.01, 0.2, 0.03, 0.1, 0.05, 0.02, 0.005]
SPEC = {"title": "t", "base": {"rounds": 27, "eval_every": 1, "validation_fraction": 0.1},
        "rows": {"R": {}}, "columns": {"A": {"grid": {"lr": LRS}}}, "seeds": [0, 1],
        "hyperband": {"min_rounds": 1, "reduction_factor": 3}}


def quality(lr):                         # best at lr 0.1, worse the further from it
    return 1.0 / (1.0 + abs(__import__("math").log10(lr / 0.1)))


def fake_run(calls):
    """Train cells to their config's rounds: val accuracy quality(lr) * round / 27."""
    def run(cells):
        calls.append(len(cells))
        return {c: [{"round": t, "val_accuracy": quality(c.config.lr) * t / 27,
                     "accuracy": quality(c.config.lr) * t / 27}
                    for t in range(1, c.config.rounds + 1)] for c in cells}
    return run


def test_weak_points_stop_at_a_rung_and_the_best_trains_to_the_end(tmp_path):
    cells = sweep.cells(SPEC, None, str(tmp_path))
    calls = []
    results = hyperband.run_pruned(cells, fake_run(calls), SPEC["hyperband"])
    assert set(results) == set(cells)
    stopped = {c.config.lr: e[-1]["round"] for c, e in results.items() if e[-1].get("pruned")}
    finished = {c.config.lr for c, e in results.items() if not e[-1].get("pruned")}
    assert stopped and 0.1 in finished and 0.1 not in stopped
    assert set(stopped.values()) <= {1, 3, 9}              # the rungs below 27
    for c, e in results.items():                          # a stopped run ends at its rung
        if e[-1].get("pruned"):
            assert [r["round"] for r in e[:-1]] == list(range(1, e[-1]["round"] + 1))
    # both seeds of a point stop together
    assert all(results[c][-1].get("pruned") == results[d][-1].get("pruned")
               for c in cells for d in cells if c.config.lr == d.config.lr)
    setting, _ = sweep.selected(SPEC, results, "R", "A")
    assert dict(setting) == {"lr": 0.1}
    again = hyperband.run_pruned(cells, fake_run([]), SPEC["hyperband"])
    assert again == results                                # a rerun replays the decisions


def test_a_stopped_point_is_never_selected_even_with_the_best_score(tmp_path):
    cells = sweep.cells({**SPEC, "columns": {"A": {"grid": {"lr": [0.1, 0.2]}}}}, None,
                        str(tmp_path))
    results = {c: [{"round": 27, "val_accuracy": 0.5}] for c in cells}
    for c in cells:
        if c.config.lr == 0.2:
            results[c] = [{"round": 9, "val_accuracy": 0.9}, {"round": 9, "pruned": True}]
    assert dict(sweep.selected(SPEC, results, "R", "A")[0]) == {"lr": 0.1}


@pytest.mark.parametrize("options, message", [
    ({"min_rounds": 0}, "hyperband min_rounds must be an integer >= 1, got 0"),
    ({"min_rounds": 2, "reduction_factor": 1}, "reduction_factor must be an integer >= 2"),
    ({"rounds": 2}, "must be an object with min_rounds"),
])
def test_bad_hyperband_options_are_one_line(options, message, tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({**SPEC, "hyperband": options}))
    with pytest.raises(FljaxError, match=message):
        sweep.load_sweep(str(path))


def test_rungs_are_multiples_of_the_evaluation_interval():
    assert hyperband.rungs(1, 3, 27, 1) == [1, 3, 9, 27]
    assert hyperband.rungs(2, 3, 40, 5) == [5, 10, 20, 40]


def test_a_hyperband_sweep_runs_end_to_end_and_resumes_to_the_same_table(tmp_path, capsys):
    """Each grid point trains rung by rung (resuming its checkpoints); the pruning decisions
    themselves are checked above, with a stand-in for training."""
    spec = {"title": "t", "base": {"rounds": 2, "eval_every": 1, "validation_fraction": 0.2,
                                   "num_clients": 10, "clients_per_round": 4,
                                   "local_epochs": 1},
            "rows": {"R": {}}, "columns": {"A": {"grid": {"lr": [1e-5, 0.1]}}},
            "seeds": [0], "hyperband": {"min_rounds": 1, "reduction_factor": 2}}
    path = tmp_path / "s.json"
    path.write_text(json.dumps(spec))
    argv = ["sweep", str(path), "--out-dir", str(tmp_path / "runs"), "--quiet"]
    assert main(argv) == 0
    table = (tmp_path / "runs" / "base" / "results.md").read_text()
    assert "lr=0.1" in table
    logs = sorted((tmp_path / "runs").rglob("metrics.jsonl"))
    assert len(logs) == 2 and all('"round": 2' in log.read_text() for log in logs)
    before = [log.read_text() for log in logs]
    assert main(argv) == 0                              # replayed from the checkpoints
    assert (tmp_path / "runs" / "base" / "results.md").read_text() == table
    assert [log.read_text() for log in logs] == before
    capsys.readouterr()


def test_a_scale_may_set_its_own_hyperband(tmp_path):
    spec = {**SPEC, "scales": {"small": {"hyperband": {"min_rounds": 2}},
                               "bad": {"hyperband": {"min_rounds": -1}}}}
    assert sweep.hyperband_options(spec, "small") == {"min_rounds": 2}
    assert sweep.hyperband_options(spec, None) == SPEC["hyperband"]
    path = tmp_path / "s.json"
    path.write_text(json.dumps(spec))
    with pytest.raises(FljaxError, match="min_rounds must be an integer >= 1, got -1"):
        sweep.load_sweep(str(path))
