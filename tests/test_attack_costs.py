"""experiments/attack_costs.py: the attack tables of docs/reproductions/evidence.md's
Fashion-MNIST sections are what the script computes from the checked-in runs (so a number on the
page that drifts from its data fails here); a row the folder lacks is one line (exit 2)."""
import pathlib

import pytest

from tests.experiment_script import load

ROOT = pathlib.Path(__file__).parents[1]
FOLDER = ROOT / "experiments" / "results" / "evidence_byzantine_fashion_mnist"
PAGE = ROOT / "docs" / "reproductions" / "evidence.md"
ROWS = ["non-IID mimic (warm-up)", "IID mimic (warm-up)", "non-IID sign flip", "non-IID ALIE",
        "non-IID IPM", "non-IID label flip", "IID sign flip", "non-IID mimic",
        "IID label flip", "IID mimic", "IID IPM", "IID ALIE"]


def test_the_pages_fashion_mnist_attack_tables_are_the_scripts(capsys):
    script = load("attack_costs")
    page = PAGE.read_text()
    for row in ROWS:
        assert script.main([str(FOLDER), row]) == 0
        table = capsys.readouterr().out.split("\n\n")[0]
        assert len(table.splitlines()) == 2 + 12 and table in page, row


def test_paired_differences_and_the_grid_edge_by_hand():
    script = load("attack_costs")
    line = {"row": "IID x", "selected": "1", "setting": "server_lr=0.4"}
    rows = [{**line, "column": c, "seed": str(s), "accuracy": str(a)}
            for c, accs in (("CClip", (0.9, 0.8, 0.7)), ("mean", (0.8, 0.8, 0.5)))
            for s, a in enumerate(accs)]
    rows += [{**line, "row": "IID no attack", "column": "mean", "seed": str(s), "accuracy": "0.6"}
             for s in range(3)]
    rows += [{**line, "column": "mean", "seed": "0", "accuracy": "0.1", "selected": "0",
              "setting": "server_lr=0.2"}]
    table = script.cost_table(rows, "IID x", "IID no attack").splitlines()
    # mean under x minus none: (+20, +20, -10) points: mean +10.00, std 17.32, p of ttest_rel
    assert table[0] == "| rule | no attack | x | x - none | bucketing - none, under x |"
    assert table[3] == "| mean | 60.00 ± 0.00 | 70.00 ± 17.32 | +10.00 ± 17.32 (p = 0.42) | - |"
    extra = script.clip_and_grid(rows, "IID x").splitlines()
    assert extra[0] == "CClip - mean: +10.00 ± 10.00 (p = 0.23)"   # (+10, 0, +20): t = sqrt 3
    assert extra[-1] == "mean: server lr 0.4 (grid edge) of [0.2, 0.4]"


def test_a_row_the_folder_lacks_is_one_line(capsys):
    assert load("attack_costs").main([str(FOLDER), "IID nothing"]) == 2
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and "'IID nothing'" in error
