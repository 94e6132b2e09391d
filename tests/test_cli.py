"""The CLI runs a real experiment on digits (bad input: test_bad_input.py)."""

import json
import subprocess
import sys

import pytest

from fljax.cli import main


def test_cli_smoke_run_on_digits(tmp_path):
    out = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "fljax", "--rounds", "6", "--eval-every", "3", "--quiet",
         "--out-dir", str(out)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "final accuracy" in result.stdout
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rounds = [line for line in lines if line["kind"] == "round"]
    evals = [line for line in lines if line["kind"] == "eval"]
    assert [r["round"] for r in rounds] == [1, 2, 3, 4, 5, 6]
    assert [e["round"] for e in evals] == [3, 6]
    assert all(0.0 <= e["accuracy"] <= 1.0 for e in evals)
    # Six rounds of FedAvg on digits beat chance (10 classes) clearly.
    assert evals[-1]["accuracy"] > 0.3
    assert json.loads((out / "config.json").read_text())["rounds"] == 6


def test_cli_reads_a_config_file_and_flags_override_it(tmp_path, capsys):
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"rounds": 50, "partition": "iid", "local_steps": 2,
                                  "local_epochs": None}))
    code = main(["--config", str(config), "--rounds", "2", "--eval-every", "1", "--quiet",
                 "--out-dir", str(tmp_path / "r")])
    assert code == 0
    saved = json.loads((tmp_path / "r" / "config.json").read_text())
    assert saved["rounds"] == 2 and saved["partition"] == "iid" and saved["local_steps"] == 2


def test_argparse_errors_are_one_line_and_the_usage_is_in_help(capsys):
    assert main(["--lr", "fast"]) == 2
    assert capsys.readouterr().err == "fljax: error: argument --lr: invalid float value: 'fast'\n"
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith("usage: fljax")
