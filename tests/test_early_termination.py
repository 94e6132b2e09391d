"""Early termination of a sweep's weak grid points (fljax.runner.early_termination, FedGA's B.2):
points more than the margin below the best at a fraction of the rounds stop there and are never
selected, the rest train to the end, a rerun replays the decisions, bad options are one line, and
fljax sweep uses it."""

import json

import pytest

from fljax.errors import FljaxError
from fljax.runner import early_termination, sweep
from fljax.runner.cli import main
from tests.test_hyperband import fake_run, quality

LRS = [0.001, 0.01, 0.05, 0.1, 0.2]
SPEC = {"title": "t", "base": {"rounds": 20, "eval_every": 2, "validation_fraction": 0.1},
        "rows": {"R": {}}, "columns": {"A": {"grid": {"lr": LRS}}, "B": {"lr": 0.1}},
        "seeds": [0, 1], "early_termination": {"fraction": 0.2, "margin": 0.05}}


def test_points_below_the_best_by_the_margin_stop_at_a_fifth_of_the_rounds(tmp_path):
    cells = sweep.cells(SPEC, None, str(tmp_path))
    calls = []
    results = early_termination.run_terminated(cells, fake_run(calls), SPEC["early_termination"])
    assert set(results) == set(cells)
    # at round 4 (a fifth of 20) the scores are quality(lr) * 4 / 27, the best lr 0.1's 0.148; a
    # point stops below 0.148 - 0.05: lr 0.001 (0.049) and 0.01 (0.074), not 0.05 or 0.2 (0.114)
    stopped = {c.config.lr for c, e in results.items() if e[-1].get("pruned")}
    assert stopped == {lr for lr in LRS if quality(lr) * 4 / 27 < quality(0.1) * 4 / 27 - 0.05}
    assert stopped == {0.001, 0.01}
    for c, e in results.items():
        if e[-1].get("pruned"):
            assert e[-1]["round"] == 4 and [r["round"] for r in e[:-1]] == [1, 2, 3, 4]
        else:
            assert e[-1]["round"] == 20
    assert calls == [len(cells), len(cells) - 2 * len(stopped)]    # two batched calls
    assert dict(sweep.selected(SPEC, results, "R", "A")[0]) == {"lr": 0.1}
    again = early_termination.run_terminated(cells, fake_run([]), SPEC["early_termination"])
    assert again == results


def test_a_wide_margin_stops_nothing_and_a_diverged_point_stops(tmp_path):
    cells = sweep.cells(SPEC, None, str(tmp_path))
    results = early_termination.run_terminated(cells, fake_run([]),
                                               {"fraction": 0.2, "margin": 1.0})
    assert not any(e[-1].get("pruned") for e in results.values())

    def diverging(cells):
        return {c: [{"round": 1, "val_accuracy": 0.1}]
                + ([{"round": 2, "diverged": True}] if c.config.lr == 0.2 else
                   [{"round": t, "val_accuracy": 0.1} for t in range(2, c.config.rounds + 1)])
                for c in cells}
    results = early_termination.run_terminated(cells, diverging, {"fraction": 0.2, "margin": 0})
    assert {c.config.lr for c, e in results.items() if sweep.stopped(e)} == {0.2}


@pytest.mark.parametrize("options, message", [
    ({"fraction": 0.2}, "must be an object with fraction and margin"),
    ({"fraction": 1.5, "margin": 0.1}, "fraction must lie in \\(0, 1\\), got 1.5"),
    ({"fraction": 0.2, "margin": -1}, "margin must be a finite number >= 0, got -1"),
])
def test_bad_early_termination_options_are_one_line(options, message, tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({**SPEC, "early_termination": options}))
    with pytest.raises(FljaxError, match=message):
        sweep.load_sweep(str(path))


def test_a_sweep_cannot_set_both_ways_of_stopping_early(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({**SPEC, "hyperband": {"min_rounds": 2}}))
    with pytest.raises(FljaxError, match="sets both 'hyperband' and 'early_termination'"):
        sweep.load_sweep(str(path))


def sweep_command_table(spec, run, tmp_path, monkeypatch) -> str:
    """``fljax sweep`` on ``spec`` with ``run(cells) -> {cell: evaluations}`` standing in for
    training; the table it writes."""
    monkeypatch.setattr(sweep, "run_sweep", lambda cells, run_configs, max_runs: run(cells))
    path = tmp_path / "s.json"
    path.write_text(json.dumps(spec))
    (tmp_path / "runs" / "base").mkdir(parents=True)     # where the stood-in runs would write
    assert main(["sweep", str(path), "--out-dir", str(tmp_path / "runs"), "--quiet"]) == 0
    return (tmp_path / "runs" / "base" / "results.md").read_text()


def test_fljax_sweep_stops_points_early(tmp_path, monkeypatch):
    """fljax sweep passes a file's early_termination to the runs (training stood in for)."""
    calls = []
    table = sweep_command_table(SPEC, fake_run(calls), tmp_path, monkeypatch)
    assert calls == [12, 8]                   # 2 points x 2 seeds stopped at round 4
    assert "lr=0.1" in table
