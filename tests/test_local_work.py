"""A number for local_steps turns local_epochs off (and vice versa) wherever a value is given:
flags, config files, sweep levels, --set and grid keys; two numbers are an error."""

import json

import pytest

from fljax.runner import sweep
from fljax.runner.cli import config_from_args
from fljax.runner.config import ExperimentConfig, load_config
from fljax.errors import FljaxError


def work(config):
    return config.local_steps, config.local_epochs


def test_flags_and_config_files_follow_one_rule(tmp_path):
    steps, epochs = tmp_path / "steps.json", tmp_path / "epochs.json"
    steps.write_text('{"local_steps": 10}')
    epochs.write_text('{"local_epochs": 3}')
    assert work(config_from_args(["--local-steps", "10"])[0]) == (10, None)
    assert work(config_from_args(["--config", str(steps)])[0]) == (10, None)
    assert work(load_config(str(steps))) == (10, None)
    assert work(config_from_args(["--config", str(epochs)])[0]) == (None, 3)
    # a flag overrides the file's kind of local work, whichever it is
    assert work(config_from_args(["--config", str(steps), "--local-epochs", "4"])[0]) == (None, 4)
    assert work(config_from_args(["--config", str(epochs), "--local-steps", "5"])[0]) == (5, None)
    assert work(ExperimentConfig(local_steps=7, local_epochs=None).replace(local_epochs=1)) == (
        None, 1)
    assert work(ExperimentConfig().replace(local_steps=None, local_epochs=2)) == (None, 2)


def test_two_numbers_stay_an_error(tmp_path):
    both = tmp_path / "both.json"
    both.write_text('{"local_steps": 10, "local_epochs": 2}')
    with pytest.raises(FljaxError, match="set exactly one of local_steps and local_epochs"):
        config_from_args(["--config", str(both)])
    with pytest.raises(FljaxError, match="set exactly one of local_steps and local_epochs"):
        config_from_args(["--local-steps", "3", "--local-epochs", "2"])


def test_sweep_levels_set_and_grids_follow_the_rule(tmp_path):
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps({
        "base": {"local_epochs": 5, "rounds": 1},
        "rows": {"steps": {"local_steps": 10}, "epochs": {}},
        "columns": {"plain": {}, "grid": {"grid": {"local_steps": [2, 4]}}},
        "scales": {"cpu": {"epochs": {"local_epochs": 1}}}}))
    spec = sweep.load_sweep(str(path))
    got = {(c.row, c.column, c.setting): work(c.config)
           for c in sweep.cells(spec, "cpu", str(tmp_path))}
    assert got[("steps", "plain", ())] == (10, None)
    assert got[("epochs", "plain", ())] == (None, 1)
    assert got[("epochs", "grid", (("local_steps", 4),))] == (4, None)
    changed = sweep.cells(spec, None, str(tmp_path), **sweep.parse_settings(["local_epochs=3"]))
    assert {work(c.config) for c in changed} == {(None, 3)}
    grid = sweep.grid_cells(ExperimentConfig(out_dir=str(tmp_path)), [0],
                            sweep.parse_grid(["local_steps=1,2"]))
    assert [work(c.config) for c in grid] == [(1, None), (2, None)]
