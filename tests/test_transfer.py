"""Stagewise tuning (a sweep column's 'transfer', FedGA's appendix B.2): a column waits for its
source column's selection, trains with the selected values and its own grid over the rest, a
second column is the next stage; bad transfers are one line; fljax sweep runs stage after stage."""

import json

import pytest

from fljax.errors import FljaxError
from fljax.runner import sweep
from tests.test_early_termination import sweep_command_table


def score(config):
    """Validation accuracy that peaks at lr 0.1, then at beta 2 (for lr 0.1), then at
    weight decay 1e-3 (for beta 2)."""
    beta = json.loads(config.algorithm_args).get("beta", 0.0) if config.algorithm_args else 0.0
    return (1 - abs(config.lr - 0.1)) + 0.1 * (1 - abs(beta - 2.0)) \
        - 10 * abs(config.weight_decay - 1e-3)


def fake_run(calls):
    def run(cells):
        calls.append(sorted({c.column for c in cells}))
        return {c: [{"round": c.config.rounds, "val_accuracy": score(c.config),
                     "accuracy": score(c.config)}] for c in cells}
    return run


SPEC = {"title": "t", "base": {"rounds": 2, "eval_every": 1, "validation_fraction": 0.1},
        "rows": {"R": {}, "S": {}},
        "columns": {
            "FedAvg": {"grid": {"lr": [0.05, 0.1, 0.2], "weight_decay": [0.0, 1e-3]}},
            "FedGA (stage 1)": {"algorithm": "fedga", "transfer": {
                "from": "FedAvg", "keys": ["lr", "weight_decay"]},
                "grid": {"algorithm_args.beta": [0.5, 2.0, 3.5]}},
            "FedGA (stage 2)": {"algorithm": "fedga", "transfer": {
                "from": "FedGA (stage 1)", "keys": ["algorithm_args.beta"]},
                "grid": {"lr": [0.05, 0.1], "weight_decay": [0.0, 1e-3, 1e-2]}}},
        "seeds": [0, 1]}


def test_a_column_waits_for_its_source_then_takes_its_selected_values(tmp_path):
    first = sweep.cells(SPEC, None, str(tmp_path))
    assert {c.column for c in first} == {"FedAvg"}
    results = fake_run([])(first)
    taken = sweep.transfers(SPEC, first, results)
    assert taken == {(row, "FedGA (stage 1)"): {"lr": 0.1, "weight_decay": 1e-3}
                     for row in ("R", "S")}
    second = [c for c in sweep.cells(SPEC, None, str(tmp_path), transferred=taken)
              if c.column == "FedGA (stage 1)"]
    assert len(second) == 2 * 3 * 2
    assert {(c.config.lr, c.config.weight_decay) for c in second} == {(0.1, 1e-3)}
    assert {json.loads(c.config.algorithm_args)["beta"] for c in second} == {0.5, 2.0, 3.5}
    assert all(dict(c.setting).keys() == {"algorithm_args.beta"} for c in second)
    results.update(fake_run([])(second))
    assert sweep.transfers(SPEC, first + second, results)[("R", "FedGA (stage 2)")] == {
        "algorithm_args.beta": 2.0}


def test_fljax_sweep_runs_stage_after_stage(tmp_path, monkeypatch):
    calls = []
    table = sweep_command_table(SPEC, fake_run(calls), tmp_path, monkeypatch)
    assert calls == [["FedAvg"], ["FedGA (stage 1)"], ["FedGA (stage 2)"]]
    assert "lr=0.1, weight_decay=0.001" in table and "beta=2.0" in table


@pytest.mark.parametrize("transfer, message", [
    ({"from": "Nope", "keys": ["lr"]}, "transfers from 'Nope', which is not another column"),
    ({"from": "FedAvg"}, "'transfer' must be"),
    ({"from": "FedAvg", "keys": ["lr", "algorithm_args.beta"]}, "both transfers and searches"),
])
def test_bad_transfers_are_one_line(transfer, message, tmp_path):
    spec = json.loads(json.dumps(SPEC))
    spec["columns"]["FedGA (stage 1)"]["transfer"] = transfer
    path = tmp_path / "s.json"
    path.write_text(json.dumps(spec))
    with pytest.raises(FljaxError, match=message) as error:
        sweep.load_sweep(str(path))
    assert "\n" not in str(error.value)


def test_a_key_the_source_does_not_search_and_a_dropped_source_are_refused(tmp_path):
    spec = json.loads(json.dumps(SPEC))
    spec["columns"]["FedGA (stage 1)"]["transfer"]["keys"] = ["batch_size"]
    first = sweep.cells(spec, None, str(tmp_path))
    with pytest.raises(FljaxError, match="transfers \\['batch_size'\\] from 'FedAvg', whose grid"):
        sweep.transfers(spec, first, fake_run([])(first))
    with pytest.raises(FljaxError, match="takes values from 'FedAvg' \\(transfer\\): keep both"):
        sweep.restrict(SPEC, columns=["FedGA (stage 1)"])


def test_all_stages_gives_every_column_for_plans_and_checks(tmp_path):
    """all_stages (fljax sweep --plan, the settings and build checks): every stage's cells, the
    sources taken at their first grid point."""
    cell_list = sweep.all_stages(SPEC, None, str(tmp_path))
    assert [len([c for c in cell_list if c.column == k]) for k in SPEC["columns"]] == [24, 12, 24]
    stage2 = [c for c in cell_list if c.column == "FedGA (stage 2)"]
    assert {json.loads(c.config.algorithm_args)["beta"] for c in stage2} == {0.5}
