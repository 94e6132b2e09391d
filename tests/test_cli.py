"""The CLI runs a real experiment on digits (bad input: test_bad_input.py); its help teaches."""

import dataclasses
import json
import subprocess
import sys

import pytest

from fljax.cli import config_from_args, main
from fljax.config import ALGORITHMS, GROUPS, WRAPPERS, ExperimentConfig


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


def shown(value):
    return "unset" if value is None else ("on" if value else "off") if isinstance(value, bool) \
        else str(value)


def test_help_gives_every_flag_in_its_group_with_a_line_of_help_and_its_default(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())   # argparse wraps lines anywhere
    headings = [text.index(f" {group}: --") for group in GROUPS]
    assert headings == sorted(headings)
    for field in dataclasses.fields(ExperimentConfig):
        flag = "--" + field.name.replace("_", "-")
        entry = " ".join(f"{field.metadata['help']} (default: {shown(field.default)})".split())
        kinds = field.type.split(" | ")
        metavar = ", --no-" if "bool" in kinds else " INT" if "int" in kinds else \
            " FLOAT" if "float" in kinds else " STR"
        where = text.index(f" {flag}{metavar}", headings[0])
        assert 0 < text.index(entry, where) - where < 60, flag   # after the flag (and alias)
        group = GROUPS.index(field.metadata["group"])
        assert headings[group] < where < (headings + [len(text)])[group + 1], flag
    assert "--dirichlet-alpha FLOAT, --alpha FLOAT" in text


def test_dirichlet_alpha_keeps_its_old_name_in_flags_and_config_files(tmp_path, capsys):
    assert config_from_args(["--dirichlet-alpha", "0.1"])[0].dirichlet_alpha == 0.1
    assert config_from_args(["--alpha", "0.1"])[0].dirichlet_alpha == 0.1
    old = tmp_path / "old.json"
    old.write_text('{"alpha": 0.2}')
    assert config_from_args(["--config", str(old)])[0].dirichlet_alpha == 0.2
    assert config_from_args(["--config", str(old), "--dirichlet-alpha", "0.4"])[
        0].dirichlet_alpha == 0.4
    both = tmp_path / "both.json"
    both.write_text('{"alpha": 0.2, "dirichlet_alpha": 0.3}')
    assert main(["--config", str(both)]) == 2
    assert "alpha is the old name of dirichlet_alpha" in capsys.readouterr().err


def test_algorithms_lists_every_algorithm_and_wrapper_with_its_hyperparameters(capsys):
    assert main(["algorithms"]) == 0
    out = capsys.readouterr().out
    assert all(f"\n  {name}\n" in out for name in ALGORITHMS + WRAPPERS)
    assert "alpha=0.01, adaptive_alpha=true" in out                      # feddyn's signature
    assert 'unit="M", fraction (required), order="bottom_up"' in out     # gradual_unfreezing
    assert main(["algorithms", "feddyn"]) == 0
    out = capsys.readouterr().out
    assert "H^{t+1} = H^t + (1/N)" in out and "alpha: float = 0.01" in out   # rule, settings
    assert main(["algorithms", "fedfoo"]) == 2
    assert "unknown algorithm 'fedfoo'" in capsys.readouterr().err


def test_the_algorithm_listing_speaks_flags_and_json_keys_not_python(capsys):
    """Each summary line of ``fljax algorithms`` names hyperparameters as the --algorithm-args
    (--wrappers) keys they are and shared settings as flags: no Python markup (double backticks,
    calls, fljax. paths, True/False/None), no snake_case name but its own keys (so no
    ``server_lr``, ``cohort_size``), and the factory's other Python arguments (``local``,
    ``model``) as English words at most, never as ``local:`` or ``model=``."""
    import inspect
    import re

    from fljax import algorithms
    from fljax.arguments import settable
    from fljax.cli import SUMMARIES

    assert main(["algorithms"]) == 0
    out = capsys.readouterr().out
    entries = re.split(r"\n  (\w+)\n", out)        # [title, name, text, name, text, ...]
    listed = dict(zip(entries[1::2], entries[2::2]))
    assert set(listed) == set(ALGORITHMS + WRAPPERS) == set(SUMMARIES)
    python_names = {f.name for f in dataclasses.fields(ExperimentConfig)} | {
        p for each in listed for p in inspect.signature(getattr(algorithms, each)).parameters}
    for name, text in listed.items():
        summary = " ".join(SUMMARIES[name].split())
        assert " ".join(text.split()).startswith(summary), name
        keys = {p.name for p in settable(name, getattr(algorithms, name))}
        python_only = {p.name for p in inspect.signature(getattr(algorithms, name)).parameters
                       .values()} - keys
        assert not re.search(r"``|fljax\.|\w\(|\b(True|False|None)\b", summary), (name, summary)
        words = set(re.findall(r"(?<![-\w])[a-z]\w*", summary))   # not inside a --flag-name
        snake = {w for w in words if "_" in w} & python_names    # not maths such as c_i
        assert snake <= keys, (name, summary)                     # no server_lr, cohort_size
        for word in words & python_only:        # 'local', 'model': as English words only
            assert not re.search(rf"\b{word}\b\s*[:=(]", summary), (name, summary)
