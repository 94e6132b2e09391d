"""Sweep files (a paper's table as rows x columns x seeds): cells, scales, table, and every
experiments/*.json sweep at its CPU scale end to end (a few rounds)."""

import glob
import json
import os

import pytest

import fljax
from fljax.runner import sweep
from fljax.runner.cli import main
from fljax.data.idx import DEBIAN_FASHION_MNIST, has_idx
from fljax.data.leaf import write_synthetic
from fljax.errors import FljaxError
from fljax.runner.experiment import build
from fljax.runner.train import Diverged, run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SWEEPS = sorted(p for p in glob.glob(os.path.join(ROOT, "experiments", "*.json"))
                if "rows" in json.load(open(p)))

SPEC = {"title": "t", "base": {"lr": 0.1, "rounds": 10, "dirichlet_alpha": 1.0},
        "rows": {"IID": {"partition": "iid"}, "Dir": {"partition": "dirichlet", "alpha": 0.5}},
        "columns": {"A": {"algorithm": "fedavg"},
                    "B->A": {"algorithm": "feddyn", "switch_to": "fedavg", "switch_at": 8,
                             "algorithm_args": {"alpha": 0.1}}},
        "seeds": [0, 1],
        "scales": {"small": {"base": {"rounds": 4, "lr": 0.2}, "B->A": {"switch_at": 3},
                             "target_accuracy": 0.5}}}


def test_cells_apply_base_row_column_scale_in_order(tmp_path):
    cells = sweep.cells(SPEC, "small", str(tmp_path))
    assert [(c.row, c.column, c.seed) for c in cells] == [
        (r, c, s) for r in ("IID", "Dir") for c in ("A", "B->A") for s in (0, 1)]
    switched = [c for c in cells if c.column == "B->A"]
    assert all(c.config.switch_at == 3 and c.config.rounds == 4 and c.config.lr == 0.2
               for c in switched)
    assert json.loads(switched[0].config.algorithm_args) == {"alpha": 0.1}
    # A row's value overrides the base's under the field's old name too (alpha: dirichlet_alpha).
    assert cells[-1].config.partition == "dirichlet" and cells[-1].config.dirichlet_alpha == 0.5
    assert cells[0].config.dirichlet_alpha == 1.0
    assert cells[-1].config.out_dir == os.path.join(str(tmp_path), "small", "Dir", "B_to_A",
                                                    "seed_1")
    base = sweep.cells(SPEC, None, str(tmp_path), seeds=[5], rounds=2)
    assert {c.config.switch_at for c in base if c.column == "B->A"} == {8}
    assert {(c.seed, c.config.rounds) for c in base} == {(5, 2)}


def test_a_rows_cells_set_values_of_one_cell_over_its_column(tmp_path):
    spec = {**SPEC, "rows": {"IID": {"partition": "iid", "cells": {"A": {"lr": 0.3}}},
                             "Dir": SPEC["rows"]["Dir"]}}
    lrs = {(c.row, c.column): c.config.lr for c in sweep.cells(spec, "small", str(tmp_path))}
    assert lrs == {("IID", "A"): 0.3, ("IID", "B->A"): 0.2, ("Dir", "A"): 0.2,
                   ("Dir", "B->A"): 0.2}
    assert spec["rows"]["IID"]["cells"] == {"A": {"lr": 0.3}}      # the spec is not changed
    bad = {**SPEC, "rows": {"IID": {"cells": {"C": {"lr": 0.3}}}}}
    with pytest.raises(FljaxError, match="row 'IID': 'cells' must be an object of column name"):
        sweep.cells(bad, None, str(tmp_path))


def test_the_heading_names_the_scales_title_and_the_data_its_runs_used(tmp_path):
    spec = {**SPEC, "scales": {**SPEC["scales"],
                               "real": {"title": "t on real images",
                                        "base": {"dataset": "fashion_mnist", "model": "mlp"}}}}
    real = [c.config for c in sweep.cells(spec, "real", str(tmp_path))]
    assert sweep.heading(spec, "real", real) == ("t on real images (scale: real; "
                                                 "data: fashion_mnist; model: mlp)")
    small = [c.config for c in sweep.cells(spec, "small", str(tmp_path))]
    assert sweep.heading(spec, "small", small) == (f"t (scale: small; data: "
                                                   f"{small[0].dataset}; model: "
                                                   f"{small[0].model})")
    assert sweep.heading({}, None, [], "file.json") == "file.json (scale: base)"


@pytest.mark.parametrize("change, message", [
    (dict(rows={}), "'rows' must be a non-empty object"),
    (dict(columns={"a/b": {}}), "may hold only"),
    (dict(seeds=[]), "'seeds' must be a non-empty list"),
    (dict(extra=1), "unknown sweep key(s) ['extra']"),
])
def test_bad_sweep_files_are_rejected(tmp_path, change, message):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({**SPEC, **change}))
    with pytest.raises(FljaxError) as e:
        sweep.load_sweep(str(path))
    assert message in str(e.value)


def test_bad_scale_and_bad_values_name_the_run(tmp_path):
    with pytest.raises(FljaxError, match=r"scale must be one of \['small'\], got 'big'"):
        sweep.cells(SPEC, "big", str(tmp_path))
    bad = {**SPEC, "columns": {"A": {"lr": -1.0}}}
    with pytest.raises(FljaxError, match="sweep run 'IID' / 'A': lr must be > 0"):
        sweep.cells(bad, None, str(tmp_path))
    with pytest.raises(FljaxError, match="KEY=VALUE"):
        sweep.parse_settings(["rounds"])
    assert sweep.parse_settings(["rounds=3", "dataset=cifar100"]) == {"rounds": 3,
                                                                     "dataset": "cifar100"}


def test_table_mean_std_bold_best_and_rounds_to_target(tmp_path):
    cells = sweep.cells(SPEC, "small", str(tmp_path))
    curve = lambda *accs: [{"round": 2 * (i + 1), "accuracy": a, "bytes": 3e6 * (i + 1),
                            "total_flops": 5e9 * (i + 1), "time_s": 0.5 * (i + 1)}
                           for i, a in enumerate(accs)]
    results = {}
    for c in cells:
        if c.column == "A":
            results[c] = curve(0.3, 0.4) if c.seed == 0 else curve(0.3, 0.6)
        else:
            results[c] = curve(0.5, 0.8) if c.row == "IID" else curve(0.2, 0.9 - 0.5 * c.seed)
    lines = sweep.table(SPEC, results, "small").splitlines()
    assert lines[0] == "| setting | A | B->A |"
    assert lines[2] == "| IID | 50.00 ± 14.14 | 80.00 ± 0.00 |"      # 2 seeds: p = 0.2, no bold
    assert lines[3:7] == ["| IID: rounds to 50% | x | 2 |", "| IID: MB to 50% | x | 3 |",
                          "| IID: GFLOPs to 50% | x | 5 |", "| IID: seconds to 50% | x | 0.5 |"]
    assert lines[7] == "| Dir | 50.00 ± 14.14 | 65.00 ± 35.36 |"
    assert lines[8] == "| Dir: rounds to 50% | x | x |"


def test_the_best_is_bold_only_where_it_beats_the_runner_up_significantly(tmp_path):
    """Bold: the best mean of a line whose paired t-test against the second best (over the seeds
    both ran) gives p < 0.05; a larger mean that is no significant gain is not marked."""
    spec = {**SPEC, "seeds": [0, 1, 2, 3], "rows": {"IID": SPEC["rows"]["IID"]},
            "columns": {"A": {}, "B": {}, "C": {}}}
    accuracy = {"A": [0.50, 0.60, 0.55, 0.65], "B": [0.52, 0.63, 0.56, 0.67],
                "C": [0.10, 0.95, 0.35, 0.99]}       # C: the best mean, by luck of two seeds
    cells = sweep.cells(spec, None, str(tmp_path))
    results = {c: [{"round": 1, "accuracy": accuracy[c.column][c.seed]}] for c in cells}
    assert "**" not in sweep.table(spec, results)
    del spec["columns"]["C"]
    line = sweep.table(spec, {c: e for c, e in results.items() if c.column != "C"}).splitlines()[2]
    assert line == "| IID | 57.50 ± 6.45 | **59.50 ± 6.76** |"   # +2.0 ± 0.8, p = 0.016
    assert sweep.clear_winner([{0: 1.0, 1: 2.0}, {0: 0.5, 1: 1.5}]) == 0   # the same gain
    assert sweep.clear_winner([{0: 1.0, 1: 2.0}, {0: 0.5, 1: 1.5}], sign=-1) == 1
    assert sweep.clear_winner([{0: 1.0}, {0: 0.5}]) is None                  # one seed
    assert sweep.clear_winner([{0: 1.0, 1: 2.0}, {2: 0.5, 3: 1.5}]) is None  # no common seeds


def test_best_round_reports_each_run_at_its_best_validation_evaluation(tmp_path):
    """FederatedScope's protocol: a run counts at its evaluation with the best validation score
    (the first such), not its last; costs relative to a column use the whole runs."""
    spec = {**SPEC, "best_round": "val_accuracy", "cost_relative_to": "A"}
    cells = sweep.cells(spec, "small", str(tmp_path), seeds=[0, 1], rows=["IID"])
    assert {c.row for c in cells} == {"IID"}

    def curve(vals, accs, flops):
        return [{"round": i + 1, "val_accuracy": v, "accuracy": a, "bytes": 1e6 * (i + 1),
                 "total_flops": flops * (i + 1), "time_s": 1.0}
                for i, (v, a) in enumerate(zip(vals, accs))]

    results = {c: curve([0.5, 0.9, 0.9, 0.7], [0.1, 0.6, 0.7, 0.8], 1e9) if c.column == "A"
               else curve([0.2, 0.3, 0.4, 0.5], [0.2, 0.3, 0.4, 0.5 + 0.1 * c.seed], 3e9)
               for c in cells}
    spec = {**spec, "rows": {"IID": spec["rows"]["IID"]}}
    lines = sweep.table(spec, results, "small").splitlines()
    assert lines[2] == "| IID | 60.00 ± 0.00 | 55.00 ± 7.07 |"
    assert lines[3:5] == ["| IID: bytes / A | 1.00x | 1.00x |", "| IID: FLOPs / A | 1.00x | 3.00x |"]
    assert sweep.at_best_round([{"round": 1, "diverged": True}], "val_accuracy") == [
        {"round": 1, "diverged": True}]
    with pytest.raises(FljaxError, match=r"rows \['nope'\] are not rows"):
        sweep.cells(spec, "small", str(tmp_path), rows=["nope"])
    path = tmp_path / "s.json"
    path.write_text(json.dumps({**SPEC, "cost_relative_to": "C"}))
    with pytest.raises(FljaxError, match="'cost_relative_to' must name a column"):
        sweep.load_sweep(str(path))


def test_a_metric_may_name_keys_in_order_of_preference(tmp_path):
    """["gamma/accuracy", "accuracy"]: FedDyn's aggregate where a run logs it (FedBug's code
    reports it for FedDyn), the global model elsewhere."""
    spec = {**SPEC, "metrics": {"avg model": ["gamma/accuracy", "accuracy"],
                                "all": "all_model/accuracy"}}
    cells = sweep.cells(spec, "small", str(tmp_path), seeds=[0])
    results = {c: [{"round": 4, "accuracy": 0.5, "all_model/accuracy": 0.6,
                    **({"gamma/accuracy": 0.7} if c.column == "B->A" else {})}] for c in cells}
    lines = sweep.table(spec, results, None).splitlines()
    assert lines[2:4] == ["| IID: avg model | 50.00 | 70.00 |",      # 1 seed: no test, no bold
                          "| IID: all | 60.00 | 60.00 |"]
    path = tmp_path / "s.json"
    path.write_text(json.dumps(spec))
    assert sweep.load_sweep(str(path))["metrics"]["avg model"] == ["gamma/accuracy", "accuracy"]
    path.write_text(json.dumps({**spec, "metrics": {"a": []}}))
    with pytest.raises(FljaxError, match="list of keys"):
        sweep.load_sweep(str(path))


@pytest.mark.parametrize("path", SWEEPS, ids=[os.path.basename(p) for p in SWEEPS])
def test_every_scale_of_every_experiment_sweep_validates(path, tmp_path):
    spec = sweep.load_sweep(path)
    assert {"cpu", "full"} <= set(spec["scales"])
    for scale in spec["scales"]:
        cell_list = sweep.all_stages(spec, scale, str(tmp_path))
        assert {c.column for c in cell_list} == set(spec["columns"])


@pytest.mark.parametrize("path", SWEEPS, ids=[os.path.basename(p) for p in SWEEPS])
def test_every_cpu_cell_builds_and_the_last_cell_trains(path, tmp_path):
    """Every CPU-scale cell (row x column) builds (data, model, algorithm with its arguments,
    round program) at its first grid point (the other points differ only in values that cells()
    validates); the last cell (the table's last method, usually the paper's own; the first is
    usually plain FedAvg, trained in many other tests) trains for one round."""
    spec = sweep.load_sweep(path)
    if spec["base"].get("dataset") == "fashion_mnist" and not has_idx("fashion_mnist",
                                                                      DEBIAN_FASHION_MNIST):
        pytest.skip(f"Fashion-MNIST's IDX files are not in {DEBIAN_FASHION_MNIST}: "
                    f"apt-get install dataset-fashion-mnist (.ci/run does)")
    changes = {}
    if spec["base"].get("dataset") == "leaf/synthetic":   # its script writes 1,000 users first
        write_synthetic(str(tmp_path / "leaf"), num_users=200, max_size=50, seed=0)
        changes = dict(data_dir=str(tmp_path / "leaf"), num_clients=200, clients_per_round=50)
    if spec["base"].get("accountant") == "pld":   # calibrating z for 1 round: seconds by PLD
        changes["accountant"] = "rdp"
    cells = sweep.all_stages(spec, "cpu", str(tmp_path), seeds=[0], rounds=1,
                             eval_every=1, **changes)
    first_points = {}
    for cell in cells:
        first_points.setdefault((cell.row, cell.column), cell)
    for cell in first_points.values():
        build(cell.config)
    evaluations = run(cells[-1].config, progress=False)
    assert len(evaluations) == 1 and 0.0 <= evaluations[0]["accuracy"] <= 1.0


# The sweep command end to end (runs, table, resume) on one file; every file's cells are built and
# its corner cells trained above.
SMALL = [p for p in SWEEPS if os.path.basename(p) == "feddyn_init_table1_cross_device.json"]


@pytest.mark.parametrize("path", SMALL, ids=[os.path.basename(p) for p in SMALL])
def test_experiment_sweep_runs_at_cpu_scale(path, tmp_path, capsys):
    out = str(tmp_path / "runs")
    argv = ["sweep", path, "--scale", "cpu", "--out-dir", out, "--seeds", "0",
            "--set", "rounds=2", "--set", "eval_every=1", "--quiet"]
    assert main(argv) == 0
    with open(os.path.join(out, "cpu", "results.md")) as f:
        text = f.read()
    spec = sweep.load_sweep(path)
    assert all(f"| {row} |" in text for row in spec["rows"])
    logs = glob.glob(os.path.join(out, "cpu", "*", "*", "seed_0", "metrics.jsonl"))
    assert len(logs) == len(spec["rows"]) * len(spec["columns"])
    before = {p: open(p).read() for p in logs}
    assert main(argv) == 0                      # finished runs resume and are not trained again
    assert {p: open(p).read() for p in logs} == before
    capsys.readouterr()


GRID_SPEC = {"title": "t", "base": {"rounds": 2, "validation_fraction": 0.2},
             "rows": {"Dir": {"partition": "dirichlet"}},
             "columns": {"A": {"algorithm": "fedavg", "grid": {"lr": [0.1, 0.2]}},
                         "P": {"algorithm": "fedprox",
                               "grid": {"lr": [0.1], "algorithm_args.mu": [0.01, 0.1]}}},
             "seeds": [0, 1, 2], "compare": [["P", "A"]]}


def test_sweep_seeds_take_ranges_and_a_bad_list_is_one_line(tmp_path, capsys):
    path = tmp_path / "grid.json"
    path.write_text(json.dumps(GRID_SPEC))
    for seeds, shown in ((["2-1"], "2-1"), (["0-2", "2"], "0-2,2"), (["a"], "a")):
        assert main(["sweep", str(path), "--out-dir", str(tmp_path), "--seeds", *seeds]) == 2
        line = capsys.readouterr().err.strip()
        assert "\n" not in line and f"got {shown!r}" in line and "--seeds" in line, line


def test_grids_expand_into_runs_with_their_settings(tmp_path):
    cells = sweep.cells(GRID_SPEC, None, str(tmp_path))
    assert len(cells) == (2 + 2) * 3
    prox = [c for c in cells if c.column == "P" and c.seed == 1]
    assert [json.loads(c.config.algorithm_args) for c in prox] == [{"mu": 0.01}, {"mu": 0.1}]
    assert prox[1].setting == (("lr", 0.1), ("algorithm_args.mu", 0.1))
    assert prox[1].config.out_dir == os.path.join(str(tmp_path), "base", "Dir", "P",
                                                  "lr_0.1_mu_0.1", "seed_1")
    with pytest.raises(FljaxError, match="take a dotted path"):
        sweep.cells({**GRID_SPEC, "columns": {"A": {"grid": {"lr.x": [1]}}}}, None, str(tmp_path))



def test_grids_merge_key_by_key_down_the_levels(tmp_path):
    """A row's grid and a column's grid give the cell both (FedDecay's SST2 batch sizes under
    each method's lr grid); a later level's key replaces that key, and null drops it."""
    spec = {**GRID_SPEC, "seeds": [0],
            "rows": {"R": {"grid": {"batch_size": [16, 32]}}},
            "scales": {"small": {"R": {"grid": {"batch_size": None}}, "A": {"grid": {"lr": [0.3]}}}}}
    cells = sweep.cells(spec, None, str(tmp_path))
    assert [dict(c.setting) for c in cells if c.column == "A"] == [
        {"batch_size": 16, "lr": 0.1}, {"batch_size": 16, "lr": 0.2},
        {"batch_size": 32, "lr": 0.1}, {"batch_size": 32, "lr": 0.2}]
    assert [c.config.batch_size for c in cells if c.column == "P"] == [16, 16, 32, 32]
    small = sweep.cells(spec, "small", str(tmp_path))
    assert [c.setting for c in small if c.column == "A"] == [(("lr", 0.3),)]
    assert {c.setting for c in small if c.column == "P"} == {
        (("lr", 0.1), ("algorithm_args.mu", 0.01)), (("lr", 0.1), ("algorithm_args.mu", 0.1))}

def test_selection_uses_the_validation_split_and_reports_test_and_paired_stats(tmp_path):
    """lr 0.2 wins on validation while lr 0.1 wins on test: the table shows lr 0.2's TEST
    accuracy; the paired difference and its t-test match scipy's."""
    import scipy.stats

    results = {}
    test_acc = {(("lr", 0.1),): [0.9, 0.92, 0.91], (("lr", 0.2),): [0.7, 0.74, 0.72]}
    for c in sweep.cells(GRID_SPEC, None, str(tmp_path)):
        if c.column == "A":
            val = 0.8 if c.setting == (("lr", 0.2),) else 0.6
            acc = test_acc[c.setting][c.seed]
        else:
            val = 0.9 if dict(c.setting)["algorithm_args.mu"] == 0.01 else 0.5
            acc = [0.75, 0.79, 0.74][c.seed] if val == 0.9 else 0.1
        results[c] = [{"round": 2, "accuracy": acc, "val_accuracy": val, "time_s": 1.0}]
    lines = sweep.table(GRID_SPEC, results).splitlines()
    assert lines[2] == "| Dir: selected on val_accuracy | lr=0.2 | lr=0.1, mu=0.01 |"
    assert lines[3] == "| Dir | 72.00 ± 2.00 | 76.00 ± 2.65 |"       # p = 0.057: no bold
    p = scipy.stats.ttest_rel([75, 79, 74], [70, 74, 72]).pvalue
    assert lines[-3] == "| paired difference of test accuracy (points) | Dir |"
    assert lines[-1] == f"| P - A | +4.00 ± 1.73 (p = {p:.2g}, n = 3) |"
    no_validation = {c: [{k: v for k, v in e[0].items() if k != "val_accuracy"}]
                     for c, e in results.items()}
    with pytest.raises(FljaxError, match="never select on the test set"):
        sweep.table(GRID_SPEC, no_validation)


def test_a_validation_split_is_held_out_of_the_clients_and_scored(tmp_path):
    config = GRID_SPEC["base"] | {"num_clients": 10, "clients_per_round": 5, "eval_every": 2,
                                  "out_dir": str(tmp_path)}
    config = fljax.ExperimentConfig().replace(**config)
    experiment = build(config)
    full = fljax.load_dataset("digits")
    assert int(experiment.data.count.sum()) == len(full.y_train) - round(0.2 * len(full.y_train))
    evaluations = run(config, progress=False)
    assert 0 <= evaluations[-1]["val_accuracy"] <= 1 and "val_loss" in evaluations[-1]


def test_a_diverging_grid_point_is_recorded_and_never_selected(tmp_path):
    """A NaN run does not stop the sweep: it is recorded, its point cannot win the selection
    (even with a higher validation score on the seeds that finished), and the table counts it."""
    cells = sweep.cells(GRID_SPEC, None, str(tmp_path))

    def train_one(config):
        if json.loads(config.algorithm_args).get("mu") == 0.1 and config.seed == 2:
            return Diverged("round 3: the training loss is nan", 3)
        good = config.algorithm == "fedprox" and json.loads(config.algorithm_args)["mu"] == 0.1
        return [{"round": 2, "accuracy": 0.5, "val_accuracy": 0.9 if good else 0.4}]

    train = lambda configs: [train_one(config) for config in configs]
    results = sweep.run_sweep(cells, train, max_runs=4)
    diverged = [c for c, e in results.items() if e[-1].get("diverged")]
    assert len(diverged) == 1 and results[diverged[0]] == [{"round": 3, "diverged": True}]
    lines = sweep.table(GRID_SPEC, results).splitlines()
    assert lines[2].endswith("| lr=0.1, mu=0.01 |")       # mu 0.1 had the best val score

    no_grid = {**GRID_SPEC, "columns": {"P": {"algorithm": "fedprox",
                                              "algorithm_args": {"mu": 0.1}}}, "compare": []}
    results = sweep.run_sweep(sweep.cells(no_grid, None, str(tmp_path)), train)
    assert sweep.table(no_grid, results).splitlines()[2] == \
        "| Dir | 50.00 ± 0.00 (1 of 3 diverged) |"                  # one column: no best


def test_the_tuning_rule_extends_a_grid_past_a_selected_edge_until_it_is_interior(tmp_path):
    """Validation accuracy peaks at lr 0.8 on a grid {0.1, 0.2}: the rule adds 0.4 (every seed,
    its own directory, lr in the config), then 0.8, then 1.6, and stops once the selected value
    (0.8) is interior; FedProx's mu grid is not extended (not an ``extend`` key). A lower edge
    extends downward (0.05, 0.02 -> 0.008)."""
    spec = {**GRID_SPEC, "extend": ["lr"],
            "columns": {**GRID_SPEC["columns"],
                        "P": {"algorithm": "fedprox",
                              "grid": {"lr": [0.1], "algorithm_args.mu": [0.01, 0.1]}}}}
    cell_list = sweep.cells(spec, None, str(tmp_path))

    def train(configs):
        return [[{"round": r, "accuracy": 0.5, "val_accuracy": (1 - abs(c.lr - 0.8)) * r / 4}
                 for r in (1, 2, 3, 4)] for c in configs]

    results = sweep.run_sweep(cell_list, train)
    added_lrs = []
    while more := sweep.extensions(spec, cell_list, results):
        assert {(c.column, c.seed) for c in more} == {("A", 0), ("A", 1), ("A", 2)}
        lr = more[0].config.lr
        assert all(c.setting == (("lr", lr),) and c.config.lr == lr for c in more)
        assert more[0].config.out_dir == os.path.join(str(tmp_path), "base", "Dir", "A",
                                                      f"lr_{lr}", "seed_0")
        added_lrs.append(lr)
        cell_list += more
        results.update(sweep.run_sweep(more, train))
    assert added_lrs == [0.4, 0.8, 1.6]
    lines = sweep.table(spec, results).splitlines()
    assert lines[2] == "| Dir: selected on val_accuracy | lr=0.8 | lr=0.1, mu=0.01 |"
    # the selected points rise over the last quarter (round 3 -> 4): (1 - |lr - 0.8|) / 4
    assert lines[4] == "| Dir: val_accuracy gain, last 25% of rounds | 25.00 ± 0.00 | " \
                       "7.50 ± 0.00 |"

    low = {**spec, "columns": {"A": {"algorithm": "fedavg", "grid": {"lr": [0.05, 0.02]}}},
           "compare": []}
    cell_list = sweep.cells(low, None, str(tmp_path))
    results = {c: [{"round": 1, "accuracy": 0.5, "val_accuracy": 1 - c.config.lr}]
               for c in cell_list}
    assert {c.config.lr for c in sweep.extensions(low, cell_list, results)} == {0.008}
    assert "(grid edge)" in sweep.table(low, results).splitlines()[2]


def test_max_extensions_caps_the_rule_and_a_scale_may_raise_it(tmp_path):
    """Validation accuracy peaks at lr 0.8 on a grid {0.1, 0.2}: with the default cap the rule
    ends interior (0.4, 0.8, 1.6); with ``max_extensions`` 1 it stops after 0.4 and the table
    marks the edge; a scale's own value replaces the sweep's; a bad value is one line."""
    spec = {**GRID_SPEC, "extend": ["lr"], "columns": {"A": GRID_SPEC["columns"]["A"]},
            "compare": [], "max_extensions": 1, "scales": {"wide": {"max_extensions": 3}}}
    train = lambda configs: [[{"round": 1, "accuracy": 0.5,
                               "val_accuracy": 1 - abs(c.lr - 0.8)}] for c in configs]

    def tune(spec, scale):
        cell_list = sweep.cells(spec, scale, str(tmp_path / str(scale)))
        results = sweep.run_sweep(cell_list, train)
        added = []
        cell_list = sweep.extend_grids(spec, scale, cell_list, results, lambda more: (
            added.append(sorted({c.config.lr for c in more})), sweep.run_sweep(more, train))[1])
        assert set(results) == set(cell_list)
        return added, sweep.table(spec, results).splitlines()[2]

    assert tune({k: v for k, v in spec.items() if k != "max_extensions"}, None) == (
        [[0.4], [0.8], [1.6]], "| Dir: selected on val_accuracy | lr=0.8 |")
    assert tune(spec, None) == ([[0.4]], "| Dir: selected on val_accuracy | lr=0.4 (grid edge) |")
    assert tune(spec, "wide")[0] == [[0.4], [0.8], [1.6]]
    for bad, where in ((-1, "sweep"), (True, "sweep"), ("8", "sweep scale 'wide'")):
        path = tmp_path / "bad.json"
        path.write_text(json.dumps({**spec, "max_extensions": bad} if where == "sweep" else
                                   {**spec, "scales": {"wide": {"max_extensions": bad}}}))
        with pytest.raises(FljaxError, match=f"^{where} 'max_extensions' must be an integer "
                                             f">= 0, got {bad!r}$"):
            sweep.load_sweep(str(path))


def test_bounds_stop_the_extension_at_the_bound_and_a_selection_there_is_no_edge(tmp_path):
    """FedDecay's beta lies in [0, 1]: from a grid {0.2, 0.6} whose score rises with beta, the
    rule's next step, 0.6^2 / 0.2 = 1.8, is clipped to the bound 1; beta 1 selected is no grid
    edge and nothing more is added. Without bounds the step is 1.8. A bad bound is one line."""
    spec = {**GRID_SPEC, "extend": ["lr", "algorithm_args.mu"], "compare": [],
            "bounds": {"algorithm_args.mu": [0, 1]},
            "columns": {"P": {"algorithm": "fedprox",
                              "grid": {"lr": [0.1], "algorithm_args.mu": [0.2, 0.6]}}}}
    train = lambda configs: [[{"round": 1, "accuracy": 0.5, "val_accuracy":
                               json.loads(c.algorithm_args)["mu"]}] for c in configs]
    mu = lambda cells: sorted({json.loads(c.config.algorithm_args)["mu"] for c in cells})

    def tune(spec):
        cell_list = sweep.cells(spec, None, str(tmp_path))
        results, added = sweep.run_sweep(cell_list, train), []
        sweep.extend_grids(spec, None, cell_list, results, lambda more: (
            added.append(mu(more)), sweep.run_sweep(more, train))[1])
        return added, sweep.table(spec, results).splitlines()[2]

    assert tune(spec) == ([[1]], "| Dir: selected on val_accuracy | lr=0.1, mu=1 |")
    unbounded = {k: v for k, v in spec.items() if k != "bounds"}
    assert tune({**unbounded, "max_extensions": 1}) == (
        [[1.8]], "| Dir: selected on val_accuracy | lr=0.1, mu=1.8 (grid edge) |")
    for bad in ({"algorithm_args.mu": [1, 0]}, {"algorithm_args.mu": [0]},
                {"momentum": [0, 1]}):
        path = tmp_path / "bad.json"
        path.write_text(json.dumps({**spec, "bounds": bad}))
        with pytest.raises(FljaxError, match=r"^sweep 'bounds' must map an 'extend' key "
                                             r"\(\['lr', 'algorithm_args.mu'\]\) to \[low, high\] "
                                             r"with low < high, got '"):
            sweep.load_sweep(str(path))
    path.write_text(json.dumps({**spec, "bounds": [0, 1]}))
    with pytest.raises(FljaxError, match=r"^sweep 'bounds' must be an object \{extend key: "
                                         r"\[low, high\]\}, got \[0, 1\]$"):
        sweep.load_sweep(str(path))


def test_a_diverged_point_beyond_the_edge_ends_the_extension(tmp_path):
    spec = {**GRID_SPEC, "extend": ["lr"], "columns": {"A": GRID_SPEC["columns"]["A"]},
            "compare": []}
    cell_list = sweep.cells(spec, None, str(tmp_path))
    train = lambda configs: [Diverged("nan", 1) if c.lr > 0.3 else
                             [{"round": 1, "accuracy": 0.5, "val_accuracy": c.lr}]
                             for c in configs]
    results = sweep.run_sweep(cell_list, train)
    more = sweep.extensions(spec, cell_list, results)
    assert {c.config.lr for c in more} == {0.4}
    results.update(sweep.run_sweep(more, train))
    assert sweep.extensions(spec, cell_list + more, results) == []
    assert sweep.table(spec, results).splitlines()[2] == "| Dir: selected on val_accuracy | lr=0.2 |"


def test_extending_jointly_finds_the_point_that_one_key_at_a_time_misses(tmp_path):
    """Two interacting keys (GradAlign's lr and beta: a large lr is stable only at a large beta):
    lr stays stable while lr <= 0.12 (1 + mu), and the score peaks at lr 0.4, mu 2.5. From the
    grid {0.1, 0.2} x {0.1, 0.5} the one-key rule stops at lr 0.1 / mu 2.5 (0.8); extending
    jointly searches the selected point's 3 x 3 neighbourhood and ends at lr 0.4 / mu 2.5 (1.0),
    with every point around it run and no point run twice."""
    import math
    spec = {**GRID_SPEC, "extend": ["lr", "algorithm_args.mu"], "compare": [],
            "columns": {"P": {"algorithm": "fedprox",
                              "grid": {"lr": [0.1, 0.2], "algorithm_args.mu": [0.1, 0.5]}}}}

    def train(configs):
        def score(lr, mu):
            return 1 - 0.1 * abs(math.log2(lr / 0.4)) - 0.1 * abs(math.log(mu / 2.5, 5))
        return [Diverged("nan", 1) if c.lr > 0.12 * (1 + json.loads(c.algorithm_args)["mu"]) + 1e-9 else
                [{"round": 1, "accuracy": 0.5,
                  "val_accuracy": score(c.lr, json.loads(c.algorithm_args)["mu"])}] for c in configs]

    def search(spec):
        cell_list = sweep.cells(spec, None, str(tmp_path))
        results, added, tried = sweep.run_sweep(cell_list, train), [], set()

        def run(more):
            assert len({c.config.out_dir for c in more}) == len(more)
            assert not {c.setting for c in more} & ({c.setting for c in cell_list} | tried)
            tried.update(c.setting for c in more)
            added.append(len({c.setting for c in more}))
            return sweep.run_sweep(more, train)

        cell_list = sweep.extend_grids(spec, None, cell_list, results, run)
        best = dict(sweep.selected(spec, results, "Dir", "P")[0])
        return (round(best["lr"], 6), round(best["algorithm_args.mu"], 6)), added, cell_list

    assert search(spec)[:2] == ((0.1, 2.5), [2, 1])        # lr 0.05 and mu 2.5; then mu 12.5
    joint, added, cell_list = search({**spec, "extend_jointly": True})
    assert joint == (0.4, 2.5) and added == [5, 5, 3]
    around = {(lr, mu) for lr in (0.2, 0.4, 0.8) for mu in (0.5, 2.5, 12.5)}
    assert around <= {(dict(c.setting)["lr"], dict(c.setting)["algorithm_args.mu"])
                      for c in cell_list}
    with pytest.raises(FljaxError, match="'extend_jointly' must be true or false, got 'yes'"):
        path = tmp_path / "bad.json"
        path.write_text(json.dumps({**spec, "extend_jointly": "yes"}))
        sweep.load_sweep(str(path))


def test_results_csv_has_every_run_and_the_selected_curves(tmp_path):
    import csv
    import io

    results = {}
    for c in sweep.cells(GRID_SPEC, None, str(tmp_path)):
        val = 0.8 if c.setting in ((("lr", 0.2),), (("lr", 0.1), ("algorithm_args.mu", 0.1))) \
            else 0.6
        results[c] = [{"round": r, "accuracy": 0.1 * c.seed + 0.01 * r, "val_accuracy": val}
                      for r in (1, 2)]
    runs, curves = (list(csv.DictReader(io.StringIO(t)))
                    for t in sweep.results_csv(GRID_SPEC, results))
    assert len(runs) == 12 and len(curves) == 2 * 6
    assert {(r["column"], r["setting"]) for r in runs if r["selected"] == "1"} == {
        ("A", "lr=0.2"), ("P", "lr=0.1; algorithm_args.mu=0.1")}
    first = next(r for r in curves if r["column"] == "A" and r["seed"] == "2")
    assert (first["round"], float(first["accuracy"]), float(first["val_accuracy"])) == \
        ("1", 0.21, 0.8)


def test_best_round_selects_extends_and_writes_runs_csv_at_the_same_evaluation(tmp_path):
    """With ``best_round``, lr 0.1 has the best best-round validation score (0.9 at round 1)
    and lr 0.2 the best last one (0.7 > 0.5): the table, the tuning rule's extension (past 0.1,
    to 0.05), a transfer and runs.csv's selected flag and numbers all take the best round."""
    import csv
    import io

    spec = {**GRID_SPEC, "columns": {"A": GRID_SPEC["columns"]["A"],
                                     "T": {"algorithm": "fedavg",
                                           "transfer": {"from": "A", "keys": ["lr"]}}},
            "compare": [], "best_round": "val_accuracy", "extend": ["lr"]}
    train = lambda configs: [[{"round": 1, "accuracy": 0.3, "val_accuracy":
                               {0.05: 0.6, 0.1: 0.9, 0.2: 0.4}[c.lr]},
                              {"round": 2, "accuracy": 0.5, "val_accuracy":
                               {0.05: 0.5, 0.1: 0.5, 0.2: 0.7}[c.lr]}] for c in configs]
    cell_list = sweep.cells(spec, None, str(tmp_path))
    results = sweep.run_sweep(cell_list, train)
    assert sweep.table(spec, results).splitlines()[2] == \
        "| Dir: selected on val_accuracy | lr=0.1 (grid edge) | - |"
    assert sweep.transfers(spec, cell_list, results) == {("Dir", "T"): {"lr": 0.1}}
    more = sweep.extensions(spec, cell_list, results)
    assert {c.config.lr for c in more} == {0.05} and len(more) == 3
    runs = list(csv.DictReader(io.StringIO(sweep.results_csv(spec, results)[0])))
    chosen = [r for r in runs if r["selected"] == "1"]
    assert {r["setting"] for r in chosen} == {"lr=0.1"}
    assert {(r["round"], r["val_accuracy"]) for r in chosen} == {("1", "0.9")}
    results.update(sweep.run_sweep(more, train))
    assert sweep.table(spec, results).splitlines()[2] == \
        "| Dir: selected on val_accuracy | lr=0.1 | - |"


def test_a_sweep_restricted_to_columns_keeps_their_comparisons(tmp_path):
    spec = {**GRID_SPEC, "columns": {**GRID_SPEC["columns"], "B": {"algorithm": "fedavg"}},
            "compare": [["P", "A"], ["B", "A"]], "cost_relative_to": "B"}
    kept = sweep.restrict(spec, columns=["A", "B"])
    assert list(kept["columns"]) == ["A", "B"] and kept["compare"] == [["B", "A"]]
    assert kept["cost_relative_to"] == "B" and "cost_relative_to" not in sweep.restrict(
        spec, columns=["A", "P"])
    assert {c.column for c in sweep.cells(kept, None, str(tmp_path))} == {"A", "B"}
    assert spec["compare"] == [["P", "A"], ["B", "A"]]              # the file's spec unchanged
    with pytest.raises(FljaxError, match=r"columns \['Q'\] are not columns of the sweep"):
        sweep.restrict(spec, columns=["Q"])
    # a scale's overrides of the dropped row or columns go with them
    scaled = {**spec, "scales": {"small": {"P": {"rounds": 1}, "Dir": {"rounds": 3},
                                           "A": {"rounds": 4}}}}
    kept = sweep.restrict(scaled, columns=["A"])
    assert kept["scales"] == {"small": {"Dir": {"rounds": 3}, "A": {"rounds": 4}}}
    assert {c.config.rounds for c in sweep.cells(kept, "small", str(tmp_path))} == {4}
