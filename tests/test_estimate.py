"""``fljax.runner.estimate`` and ``fljax sweep --plan``: the estimate reads the real round's
compiled program (the same FLOPs and state as the round a run builds), Bernoulli rounds count the
chunks that train, and the plan prints every program of a sweep without data."""

import os

import jax
import numpy as np
import pytest

from fljax.data import loaders, shapes
from fljax.runner import estimate
from fljax.runner.cli import main
from fljax.runner.config import ExperimentConfig
from fljax.runner.experiment import build

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = ExperimentConfig().replace(dataset="digits", model="mlp", num_clients=10,
                                    clients_per_round=5, local_epochs=1, batch_size=16,
                                    partition="dirichlet", dirichlet_alpha=0.5, client_chunk=5)


def test_estimate_reads_the_round_a_run_builds(tmp_path):
    config = CONFIG.replace(out_dir=str(tmp_path))
    got = estimate.estimate(config)
    run = build(config)
    state = run.initial_state()
    assert got.flops_per_round == run.round_fn.flops(state)
    assert got.state_bytes == estimate.nbytes(state)
    data = run.data
    assert got.data_bytes == estimate.nbytes((data.x, data.y, data.index, data.offset,
                                              data.count))
    assert got.params == sum(a.size for a in jax.tree.leaves(state.params))
    assert got.device_bytes > got.data_bytes + got.state_bytes   # and the round's temporaries
    assert got.seconds_per_round == pytest.approx(got.flops_per_round / estimate.H100_FLOPS)
    assert got.source == "the data"


def test_bernoulli_rounds_count_the_chunks_that_train():
    config = CONFIG.replace(participation="bernoulli", client_chunk=0)
    chunk = estimate.gpu_client_chunk(config, 10)
    assert chunk == 5                      # the largest divisor of the 10 slots up to the cohort
    assert estimate.active_fraction(config, 10) == pytest.approx(1 - 0.5 ** 5)
    assert estimate.active_fraction(config.replace(participation="uniform"), 10) == 1.0
    rng = np.random.default_rng(0)
    joined = rng.random((200_000, 2, 5)) < 0.5          # q = 5 / 10, two chunks of five
    assert joined.any(-1).mean() == pytest.approx(1 - 0.5 ** 5, abs=2e-3)


@pytest.mark.skipif(not os.path.isdir(loaders.DEBIAN_FASHION_MNIST),
                    reason="Debian's dataset-fashion-mnist is not installed")
def test_known_shapes_are_the_datasets():
    real = loaders.load_dataset("fashion_mnist")
    known = shapes.stand_in("fashion_mnist", 10)
    for a, b in ((real.x_train, known.x_train), (real.x_test, known.x_test),
                 (real.y_train, known.y_train)):
        assert a.shape == b.shape and a.dtype == b.dtype
    assert real.num_classes == known.num_classes
    assert np.bincount(known.y_train).tolist() == [6000] * 10


def test_plan_prints_each_program_without_data(capsys):
    code = main(["sweep", os.path.join(ROOT, "experiments", "evidence_byzantine.json"),
                 "--scale", "full", "--plan", "--rows", "IID no attack",
                 "--columns", "mean", "median", "--seeds", "0-1"])
    out = capsys.readouterr().out
    assert code == 0
    table = [line for line in out.splitlines() if line.startswith("| 1.") or
             line.startswith("| 2.")]
    assert len(table) == 2 and all("| 2 |" in line for line in table)   # two seeds a program
    assert "Total: 2 programs, 4 runs" in out
    assert "known shapes (tfds mnist)" in out and "an estimate" in out.lower()
