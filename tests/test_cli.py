"""The CLI runs a real experiment on digits (bad input: test_bad_input.py); its help teaches."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from fljax.runner.cli import config_from_args, main
from fljax.runner.config import ALGORITHMS, GROUPS, WRAPPERS, ExperimentConfig, load_config
from tests.test_bad_input import snapshot

MAIN_JOB = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "experiments", "digits_fedavg.json")
TINY = ["--eval-every", "1", "--local-steps", "1", "--quiet"]


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
    from fljax.runner.arguments import settable
    from fljax.runner.cli import SUMMARIES

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


def test_the_default_run_dir_is_one_per_experiment_and_keeps_it_when_rounds_grow():
    base = ExperimentConfig()
    assert base.run_dir() == ExperimentConfig().run_dir()
    assert base.run_dir().startswith(os.path.join("runs", "digits_fedavg_"))
    # Settings a resume may change (the run and output ones, --rounds) keep the directory.
    assert base.replace(rounds=10, eval_every=1, checkpoint_every=5, keep_checkpoints=1,
                        client_chunk=2, unroll=4).run_dir() == base.run_dir()
    others = [base.replace(partition="iid"), base.replace(lr=0.1), base.replace(seed=1),
              base.replace(compute_dtype="bfloat16"), base.replace(algorithm="fedprox")]
    assert len({c.run_dir() for c in [base, *others]}) == 1 + len(others)
    assert others[-1].run_dir().startswith(os.path.join("runs", "digits_fedprox_"))
    # Dataset names become directory names: paths and odd characters turn into _.
    assert base.replace(dataset="leaf/femnist").run_dir().startswith(
        os.path.join("runs", "leaf_femnist_fedavg_"))
    assert base.replace(dataset="~/data/my set.npz").run_dir().startswith(
        os.path.join("runs", "data_my_set.npz_fedavg_"))
    assert base.replace(out_dir="mine").run_dir() == "mine"
    assert load_config(MAIN_JOB).run_dir() == os.path.join("runs", "digits_fedavg")
    # The README's example: a name that stays across versions, so that a resume finds its run.
    assert config_from_args(["--partition", "iid", "--rounds", "50"])[0].run_dir() == \
        os.path.join("runs", "digits_fedavg_6c164c4c")
    # With --target-epsilon the rounds set the DP noise: they are part of the experiment.
    dp = base.replace(wrappers={"dp": {"clip_norm": 0.5}}, target_epsilon=8.0)
    assert dp.replace(rounds=10).run_dir() != dp.run_dir()


def test_readme_one_liners_do_not_collide_and_fewer_rounds_train_nothing(tmp_path, monkeypatch,
                                                                         capsys):
    """The main job, then a README one-liner, in one directory: each in its own run directory.
    Asking fewer rounds than a run directory holds is refused in one line, exit 2; as many
    re-displays the finished run, saying so, exit 0; neither changes a byte there."""
    monkeypatch.chdir(tmp_path)
    assert main(["--config", MAIN_JOB, "--rounds", "2", *TINY]) == 0
    main_job = tmp_path / "runs" / "digits_fedavg"
    assert capsys.readouterr().out.startswith("fljax: writing to runs/digits_fedavg\n")
    before = snapshot(main_job)
    one_liner = ["--partition", "iid", *TINY]
    run_dir = config_from_args(one_liner)[0].run_dir()
    assert main(one_liner + ["--rounds", "2"]) == 0
    assert capsys.readouterr().out.startswith(f"fljax: writing to {run_dir}\n")
    assert snapshot(main_job) == before
    files = snapshot(run_dir)

    assert main(one_liner + ["--rounds", "1"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == (
        f"fljax: error: {run_dir} already holds 2 rounds (asked: 1); nothing was trained. Use "
        f"--rounds 2 to see its results, --out-dir NEW for a new run, or --fresh to delete this "
        f"directory's checkpoints and logs and start over\n")
    assert snapshot(run_dir) == files

    assert main(one_liner + ["--rounds", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"fljax: {run_dir} holds a finished run of 2 rounds; nothing was "
                          f"trained: its results are the stored ones\n")
    assert "final accuracy" in out
    assert snapshot(run_dir) == files

    assert main(one_liner + ["--rounds", "3"]) == 0              # more rounds continue it
    assert capsys.readouterr().out.startswith(f"fljax: writing to {run_dir}\n")
    logged = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    assert [r["round"] for r in logged if r["kind"] == "round"] == [1, 2, 3]
    assert json.loads(open(os.path.join(run_dir, "config.json")).read())["rounds"] == 3


def test_a_grid_run_again_with_fewer_rounds_trains_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    grid = ["--seeds", "0-1", "--num-clients", "4", "--clients-per-round", "2", *TINY]
    assert main(grid + ["--rounds", "2"]) == 0
    base = config_from_args(grid)[0].run_dir()
    assert capsys.readouterr().out.startswith(f"fljax: writing to {base} (2 runs, each in "
                                              f"seed_S)\n")
    files = snapshot(base)
    assert main(grid + ["--rounds", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fljax: error: 2 run directories already hold more rounds than asked "
                          f"({os.path.join(base, 'seed_0')} holds 2, asked: 1); nothing was "
                          f"trained. Use --rounds 2 to see their results"), err
    assert snapshot(base) == files
    assert main(grid + ["--rounds", "2"]) == 0
    assert capsys.readouterr().out.count("holds a finished run of 2 rounds; nothing was "
                                         "trained") == 2
    assert snapshot(base) == files
