"""FedProx's Synthetic data: the generative process, its statistics, the loader and 'natural' clients."""

import json
import math

import numpy as np
import pytest
from scipy.stats import norm

from fljax import ExperimentConfig, FljaxError, build
from fljax.runner.cli import main
from fljax.data import partition
from fljax.data.loaders import load_dataset
from fljax.data.synthetic import generate, load_synthetic


def reference_users(alpha, beta, iid, num_users, max_size, seed):
    """The module docstring's process, step by step in its draw order: per user (x, y)."""
    rng = np.random.default_rng(seed)
    sizes = [min(math.floor(s) + 50, max_size) for s in rng.lognormal(4, 2, num_users)]
    if iid:
        w_all, b_all = rng.normal(0, 1, (10, 60)), rng.normal(0, 1, 10)
    else:
        u, big_b = rng.normal(0, alpha, num_users), rng.normal(0, beta, num_users)
    std = np.array([math.sqrt(j ** -1.2) for j in range(1, 61)])
    users = []
    for k in range(num_users):
        if iid:
            v, w, b = np.zeros(60), w_all, b_all
        else:
            v = rng.normal(big_b[k], 1, 60)
            w = rng.normal(u[k], 1, (10, 60))
            b = rng.normal(u[k], 1, 10)
        x = v + std * rng.standard_normal((sizes[k], 60))
        y = []
        for example in x:
            logits = w @ example + b
            softmax = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
            y.append(int(np.argmax(softmax)))
        users.append((x, np.array(y)))
    return users


@pytest.mark.parametrize("alpha, beta, iid", [(0.5, 1.5, False), (0, 0, True)])
def test_dataset_is_the_documented_process_split_80_20_per_user(alpha, beta, iid):
    ds = load_synthetic(alpha, beta, iid=iid, num_users=6, max_size=300, seed=3)
    users = reference_users(alpha, beta, iid, 6, 300, seed=3)
    assert ds.user_train.max() == ds.user_test.max() == 5
    for k, (x, y) in enumerate(users):
        n_test = round(0.2 * len(y))
        train, test = ds.user_train == k, ds.user_test == k
        assert test.sum() == n_test and train.sum() == len(y) - n_test
        np.testing.assert_allclose(ds.x_train[train], x[:-n_test], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(ds.x_test[test], x[-n_test:], rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(ds.y_train[train], y[:-n_test])
        np.testing.assert_array_equal(ds.y_test[test], y[-n_test:])


def test_statistics_of_the_generative_process():
    """400 users (sizes capped at 400) of Synthetic(0.5, 2): the tolerances are >= 3 standard
    errors of each statistic (the KS bound is the 99% one, 1.63 / sqrt(400))."""
    users = generate(0.5, 2.0, num_users=400, max_size=400, seed=0)
    sizes = np.array([len(y) for y in users.y])
    # n_k = min(floor(L) + 50, 400), L ~ lognormal(4, 2): P(n <= m) = Phi((ln(m - 49) - 4) / 2)
    grid = np.arange(50, 400)
    law = norm.cdf((np.log(grid - 49) - 4) / 2)
    empirical = (sizes[:, None] <= grid).mean(axis=0)
    assert sizes.min() >= 50 and sizes.max() == 400
    assert np.abs(empirical - law).max() < 0.0815
    # W_k, b_k ~ N(u_k, 1) with u_k ~ N(0, 0.5^2); v_k ~ N(B_k, 1) with B_k ~ N(0, 2^2)
    model_means = users.w.mean(axis=(1, 2))
    assert users.w.std(axis=(1, 2)).mean() == pytest.approx(1.0, abs=0.01)
    assert model_means.std() == pytest.approx(math.sqrt(0.25 + 1 / 600), abs=0.06)
    assert (users.b.mean(axis=1) - model_means).std() == pytest.approx(math.sqrt(0.1), abs=0.04)
    assert users.v.mean(axis=1).std() == pytest.approx(math.sqrt(4 + 1 / 60), abs=0.22)
    # x ~ N(v_k, Sigma): pooled deviations from each user's v_k have variance j^-1.2
    noise = np.concatenate([x - v for x, v in zip(users.x, users.v)])
    np.testing.assert_allclose(noise.var(axis=0), np.arange(1, 61) ** -1.2, rtol=0.05)
    assert np.all(np.abs(noise.mean(axis=0)) < 4 * np.sqrt(np.arange(1, 61) ** -1.2 / len(noise)))
    # y = argmax of the user's own model
    for x, y, w, b in zip(users.x, users.y, users.w, users.b):
        np.testing.assert_array_equal(y, np.argmax(x @ w.T + b, axis=1))


def test_users_differ_in_synthetic_1_1_and_not_in_synthetic_iid():
    """Mean total-variation distance of the users' label distributions to the pooled one: label
    sampling noise alone gives about 0.1 at these sizes (40 to 711 training examples a user)."""
    skew = {}
    for name in ("synthetic_1_1", "synthetic_iid"):
        ds = load_dataset(name)
        skew[name] = partition.label_skew(ds.y_train, partition.natural(ds.user_train, 30), 10)
    assert skew["synthetic_1_1"] > 0.6 and skew["synthetic_iid"] < 0.2
    iid = generate(0, 0, iid=True, num_users=5, max_size=100, seed=0)
    assert np.all(iid.w == iid.w[0]) and np.all(iid.b == iid.b[0]) and not iid.v.any()


@pytest.mark.parametrize("name, alpha, beta", [("synthetic_1_1", 1, 1),
                                               ("synthetic_0.5_0.5", 0.5, 0.5),
                                               ("synthetic_0_0", 0, 0)])
def test_named_datasets_load_with_30_users(name, alpha, beta):
    ds = load_dataset(name)
    assert ds.name == name and ds.num_classes == 10
    assert ds.x_train.shape[1:] == ds.x_test.shape[1:] == (60,)
    assert ds.x_train.dtype == ds.x_test.dtype == np.float32
    assert ds.y_train.dtype == ds.user_train.dtype == ds.user_test.dtype == np.int32
    assert len(ds.user_train) == len(ds.y_train) and len(ds.user_test) == len(ds.y_test)
    assert set(np.unique(ds.user_train)) == set(np.unique(ds.user_test)) == set(range(30))
    assert 0 <= ds.y_train.min() and ds.y_train.max() <= 9
    sizes = np.bincount(ds.user_train) + np.bincount(ds.user_test)
    assert sizes.min() >= 50 and sizes.max() <= 1000
    np.testing.assert_array_equal(ds.x_train, load_synthetic(alpha, beta, seed=0).x_train)


def test_seeded():
    a, b, c = (load_synthetic(1, 1, seed=s) for s in (0, 0, 1))
    for field in ("x_train", "y_train", "user_train", "x_test", "y_test", "user_test"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    assert a.x_train.shape != c.x_train.shape or not np.array_equal(a.x_train, c.x_train)


@pytest.mark.parametrize("name", ["synthetic_1", "synthetic_a_b", "synthetic_-1_1",
                                  "synthetic_iid_2", "synthetic"])
def test_bad_names(name):
    with pytest.raises(FljaxError, match="synthetic_ALPHA_BETA") as info:
        load_dataset(name)
    assert "\n" not in str(info.value)


def test_bad_arguments():
    with pytest.raises(FljaxError, match="alpha must be a finite number >= 0, got -1"):
        generate(-1, 1)
    with pytest.raises(FljaxError, match="max_size must be an integer >= 50, got 10"):
        generate(1, 1, max_size=10)
    with pytest.raises(FljaxError, match="test_fraction must be in"):
        load_synthetic(test_fraction=1.0)


def test_natural_partition_through_build():
    config = ExperimentConfig(dataset="synthetic_1_1", partition="natural", num_clients=30,
                              model="linear", local_steps=2, local_epochs=None, rounds=1)
    experiment = build(config)
    assert experiment.data.num_clients == 30
    for k in (0, 17, 29):
        np.testing.assert_array_equal(experiment.data.client_indices(k),
                                      np.flatnonzero(experiment.dataset.user_train == k))


def test_natural_partition_through_the_cli(tmp_path):
    out = tmp_path / "run"
    code = main(["--dataset", "synthetic_1_1", "--partition", "natural", "--num-clients", "30",
                 "--model", "mlp", "--rounds", "2", "--local-steps", "2", "--eval-every", "1",
                 "--quiet", "--out-dir", str(out)])
    assert code == 0
    evals = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["kind"] == "eval"]
    assert [e["round"] for e in evals] == [1, 2]


@pytest.mark.parametrize("argv, message", [
    (["--partition", "natural"], "partition 'natural' needs a dataset that comes with its users"),
    (["--dataset", "synthetic_1_1", "--partition", "natural"],
     "num_clients must be the dataset's 30 users, got 20"),
    (["--dataset", "synthetic_1_1_1"], "unknown dataset 'synthetic_1_1_1'"),
    (["--dataset", "synthetic_1_1", "--augment", "flip_crop"],
     "flip_crop works on images [B, H, W, C], got batches of shape (16, 60)"),
])
def test_bad_input_exits_2_with_one_line(argv, message, tmp_path, capsys):
    assert main(argv + ["--rounds", "1", "--quiet", "--out-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("fljax: error: ") and message in err, err
