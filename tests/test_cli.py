"""The CLI runs a real experiment on digits; bad values exit 2 with one line naming them."""

import json
import os
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


BAD = [
    (["--lr", "-0.1"], "lr must be > 0, got -0.1"),
    (["--server-lr", "0"], "server_lr must be > 0"),
    (["--clients-per-round", "30"], "clients_per_round (30) must be <= num_clients (20)"),
    (["--num-clients", "0"], "num_clients must be an integer >= 1, got 0"),
    (["--rounds", "0"], "rounds must be an integer >= 1, got 0"),
    (["--algorithm", "fedfoo"], "algorithm must be one of"),
    (["--dataset", "no_such_dataset", "--data-dir", "/nonexistent"], "no_such_dataset"),
    (["--dataset", "mnist"], "mnist"),
    (["--partition", "zipf"], "partition must be one of"),
    (["--model", "resnet1"], "unknown model 'resnet1'"),
    (["--model", "small_cnn"], "at least 13x13"),
    (["--alpha", "-1"], "alpha must be > 0"),
    (["--lr-decay", "1.5"], "lr_decay must be in (0, 1]"),
    (["--momentum", "1.0"], "momentum must be in [0, 1)"),
    (["--batch-size", "-2"], "batch_size must be >= 1"),
    (["--local-steps", "0"], "local_steps / local_epochs must be >= 1, got 0"),
    (["--aggregation", "median"], "aggregation must be one of"),
    (["--server-optimizer", "adamm"], "unknown server optimizer 'adamm'"),
    (["--server-optimizer-args", "{momentum: 0.9}"], "server_optimizer_args must be a JSON"),
    (["--server-optimizer-args", '{"nesterovv": true}'], "does not take"),
    (["--num-devices", "64"], "num_devices must be in"),
    (["--conv-impl", "cudnn"], "conv_impl must be one of"),
    (["--num-clients", "2000"], "num_clients (2000) must be <="),
    (["--config", "/nonexistent.json"], "does not exist"),
]


@pytest.mark.parametrize("argv, message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_values_exit_2_with_one_line(argv, message, tmp_path, capsys):
    code = main(argv + ["--rounds", "1", "--quiet", "--out-dir", str(tmp_path / "r")]
                if "--rounds" not in argv else argv + ["--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1, err
    assert err.startswith("fljax: error: ") and message in err


def test_malformed_config_file_exits_2(tmp_path, capsys):
    config = tmp_path / "c.json"
    config.write_text("{rounds: 3")
    assert main(["--config", str(config)]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    config.write_text(json.dumps({"rounds": "many"}))
    assert main(["--config", str(config)]) == 2
    assert "rounds must be of type int" in capsys.readouterr().err
    config.write_text(json.dumps({"roundz": 3}))
    assert main(["--config", str(config)]) == 2
    assert "unknown config key(s) ['roundz']" in capsys.readouterr().err


def test_unwritable_out_dir_exits_2(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["--rounds", "1", "--quiet", "--out-dir", str(blocker / "sub")]) == 2
    assert "is not writable" in capsys.readouterr().err


def test_argparse_type_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--lr", "fast"])
    assert e.value.code == 2
    assert "invalid float value: 'fast'" in capsys.readouterr().err
