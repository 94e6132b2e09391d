"""A user's own algorithm, model, dataset and probe (tests/own_work.py, outside fljax) in every
tool: the CLI, a resume, a sweep file with paired statistics, a --seeds/--set grid and run_grid
(one compiled program each), by import path and by registered name, with no edit to fljax."""

import json
import os

import jax
import numpy as np
import pytest

import fljax
from fljax import registry
from fljax.runner import grouping
from fljax.runner.cli import main
from fljax.runner.config import ExperimentConfig
from fljax.runner.logs import read_log
from fljax.runner.sweep import grid_cells
from tests import own_work

OWN = ["--dataset", "tests.own_work:blobs", "--model", "tests.own_work:tiny_net",
       "--num-clients", "6", "--clients-per-round", "3", "--local-steps", "2", "--batch-size",
       "8", "--lr", "0.1", "--eval-every", "2", "--checkpoint-every", "2", "--quiet"]


def rounds_of(out_dir):
    return [r for r in read_log(os.path.join(out_dir, "metrics.jsonl")) if r["kind"] == "round"]


@pytest.fixture
def registered():
    """fedfoo, tiny_net, blobs and server_step under plain names, as a notebook would."""
    pairs = [("algorithm", "fedfoo", own_work.fedfoo), ("model", "tiny", own_work.tiny_net),
             ("dataset", "blobs", own_work.blobs), ("probe", "server_step", own_work.server_step)]
    for kind, name, factory in pairs:
        registry.register(kind, name, factory)
    yield
    for kind, name, _ in pairs:
        registry.unregister(kind, name)


def test_cli_trains_own_algorithm_model_dataset_probe_and_resumes(tmp_path, capsys):
    """By import path: FedFoo at gain 1 with its declared uniform aggregation is FedAvg with
    --aggregation uniform, loss for loss; its config records what ran; a resume continues."""
    own, plain, whole = (str(tmp_path / n) for n in ("own", "plain", "whole"))
    args = OWN + ["--algorithm", "tests.own_work:fedfoo", "--algorithm-args", '{"gain": 1.0}',
                  "--probes", "tests.own_work:server_step"]
    assert main(args + ["--rounds", "2", "--out-dir", own]) == 0
    assert "fedfoo (uniform aggregation, its paper's)" in capsys.readouterr().out
    assert main(args + ["--rounds", "4", "--out-dir", own]) == 0          # resumes at 2
    assert main(args + ["--rounds", "4", "--out-dir", whole]) == 0
    assert main(OWN + ["--algorithm", "fedavg", "--aggregation", "uniform", "--rounds", "4",
                       "--out-dir", plain]) == 0
    losses = {d: [r["train_loss"] for r in rounds_of(d)] for d in (own, plain, whole)}
    assert len(losses[own]) == 4 and losses[own] == losses[whole] == losses[plain]
    assert all(r["server_step_norm"] > 0 for r in rounds_of(own))
    saved = json.load(open(os.path.join(own, "config.json")))
    assert saved["algorithm"] == "tests.own_work:fedfoo" and saved["aggregation"] == "uniform"


def test_own_algorithm_arguments_are_checked_in_one_line(tmp_path, capsys):
    base = OWN + ["--algorithm", "tests.own_work:fedfoo", "--out-dir", str(tmp_path)]
    for given, said in (('{"gian": 2}', "does not take ['gian']; its hyperparameters are "
                                        "['gain']"),
                        ('{"gain": "big"}', "gain must be a number, got \"big\"")):
        assert main(base + ["--algorithm-args", given]) == 2
        err = capsys.readouterr().err
        assert said in err and err.count("\n") == 1, err
    assert main(OWN + ["--algorithm", "tests.own_work:fedbar"]) == 2
    assert "module 'tests.own_work' has no attribute 'fedbar'" in capsys.readouterr().err
    assert main(["algorithms", "tests.own_work:fedfoo"]) == 0
    out = capsys.readouterr().out
    assert "FedFoo: FedAvg whose server step" in out and "gain: float = 1.0" in out
    assert "--aggregation uniform" in out


def test_registered_names_grid_is_one_program_and_resumes_in_a_new_process(
        tmp_path, capsys, registered):
    """By name: a --seeds/--set grid over FedFoo's traced gain is one program; its runs record
    the import paths, so a process that never registered the names resumes them."""
    out = str(tmp_path / "grid")
    args = OWN + ["--dataset", "blobs", "--model", "tiny", "--algorithm", "fedfoo",
                  "--probes", "server_step", "--out-dir", out, "--seeds", "0-2",
                  "--set", "algorithm_args.gain=0.5,1.5"]
    assert main(args + ["--rounds", "2"]) == 0
    printed = capsys.readouterr().out
    assert "6 runs in one program" in printed, printed
    run_dir = os.path.join(out, "gain_0.5", "seed_1")
    saved = json.load(open(os.path.join(run_dir, "config.json")))
    assert saved["imports"] == {"algorithm": {"fedfoo": "tests.own_work:fedfoo"},
                                "model": {"tiny": "tests.own_work:tiny_net"},
                                "dataset": {"blobs": "tests.own_work:blobs"},
                                "probe": {"server_step": "tests.own_work:server_step"}}
    for kind, name in (("algorithm", "fedfoo"), ("model", "tiny"), ("dataset", "blobs"),
                       ("probe", "server_step")):
        registry.unregister(kind, name)                 # as in a new process
    assert main(args + ["--rounds", "4"]) == 0
    assert len(rounds_of(run_dir)) == 4
    gains = {cell.config.options.algorithm_args["gain"] for cell in grid_cells(
        ExperimentConfig(dataset="blobs", model="tiny", algorithm="fedfoo", num_clients=6,
                         clients_per_round=3, local_steps=2, local_epochs=None), [0, 1],
        {"algorithm_args.gain": [0.5, 1.5]})}
    assert gains == {0.5, 1.5}


def test_run_grid_and_sweep_with_paired_statistics(tmp_path, capsys, registered):
    config = ExperimentConfig(dataset="blobs", model="tiny", algorithm="fedfoo", num_clients=6,
                              clients_per_round=3, local_steps=2, local_epochs=None,
                              batch_size=8, lr=0.1, rounds=2, eval_every=2,
                              out_dir=str(tmp_path / "run_grid"))
    cells = grid_cells(config, [0, 1], {"lr": [0.05, 0.2]})
    assert len(grouping.group([c.config for c in cells], 100)) == 1      # one program
    results = fljax.run_grid(config, [0, 1], {"lr": [0.05, 0.2]}, progress=False)
    assert len(results) == 4 and all(len(evals) == 1 for evals in results.values())
    sweep = {"title": "own", "base": {**{k: v for k, v in config.to_dict().items()
                                         if k != "out_dir"}, "rounds": 2},
             "rows": {"IID": {"partition": "iid"}},
             "columns": {"FedFoo": {"algorithm": "tests.own_work:fedfoo",
                                    "algorithm_args": {"gain": 1.5}},
                         "FedAvg": {"algorithm": "fedavg", "aggregation": "uniform"}},
             "seeds": [0, 1, 2], "compare": [["FedFoo", "FedAvg"]]}
    path = tmp_path / "own.json"
    path.write_text(json.dumps(sweep))
    assert main(["sweep", str(path), "--out-dir", str(tmp_path / "sweep"), "--quiet"]) == 0
    table = (tmp_path / "sweep" / "base" / "results.md").read_text()
    assert "FedFoo" in table and "FedFoo - FedAvg" in table and "p =" in table, table
    runs = (tmp_path / "sweep" / "base" / "runs.csv").read_text()
    assert runs.count("FedFoo") == 3


def test_build_calls_a_factory_with_the_configs_local_optimizer():
    """fljax.build(config, algorithm=factory) trains what the config's own algorithm would: the
    config's lr, momentum, weight decay and clipping reach the factory."""
    config = ExperimentConfig(dataset="tests.own_work:blobs", model="tests.own_work:tiny_net",
                              algorithm="fedavg", algorithm_args='{"gain": 1.0}',
                              num_clients=6, clients_per_round=3, local_steps=2,
                              local_epochs=None, batch_size=8, lr=0.3, momentum=0.5,
                              weight_decay=0.01, clip_norm=1.0)
    builtin = fljax.build(config.replace(algorithm_args="{}", aggregation="uniform"))
    by_factory = fljax.build(config, algorithm=own_work.fedfoo)
    assert by_factory.config.algorithm == "tests.own_work:fedfoo"
    assert by_factory.config.aggregation == "uniform"          # the factory's declaration
    ends = [e.round_fn(e.initial_state())[0].params for e in (builtin, by_factory)]
    jax.tree.map(np.testing.assert_array_equal, *ends)
    with pytest.raises(fljax.FljaxError, match="does not take \\['mu'\\]"):
        fljax.build(config.replace(algorithm_args='{"mu": 1.0}', algorithm="fedprox"),
                    algorithm=own_work.fedfoo)


def test_papers_aggregation_by_default_and_said():
    """SCAFFOLD and FedDyn aggregate as their papers' code (unweighted) unless told otherwise;
    FedAvg keeps the example weights; `fljax algorithms` says which."""
    for name in ("scaffold", "feddyn"):
        assert ExperimentConfig(algorithm=name).resolved().aggregation == "uniform"
        assert ExperimentConfig(algorithm=name, aggregation="examples").resolved() \
            .aggregation == "examples"
    assert ExperimentConfig().resolved().aggregation == "examples"
    values = grouping.values(ExperimentConfig(algorithm="scaffold"))
    assert values["aggregation"] == "uniform"                  # batching sees what runs


def test_did_you_mean_and_registration_errors(capsys):
    for flag, wrong, meant in (("--dataset", "mnist1D", "'mnist1d'"), ("--model", "MLP", "'mlp'"),
                               ("--algorithm", "scafold", "'scaffold'")):
        assert main([flag, wrong, "--rounds", "1"]) == 2
        err = capsys.readouterr().err
        assert f"did you mean {meant}" in err and err.count("\n") == 1, err
    with pytest.raises(fljax.FljaxError, match="one of fljax's own"):
        fljax.register_algorithm("fedavg", own_work.fedfoo)
    fljax.register_algorithm("fedfoo_twice", own_work.fedfoo)
    fljax.register_algorithm("fedfoo_twice", own_work.fedfoo)          # the same: no-op
    with pytest.raises(fljax.FljaxError, match="registered already"):
        fljax.register_algorithm("fedfoo_twice", own_work.server_step)
    registry.unregister("algorithm", "fedfoo_twice")
