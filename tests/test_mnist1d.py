"""MNIST-1D: generated offline by the mnist1d package, never downloaded; the 1-D CNN learns it."""

import os
import socket
import urllib.request

import numpy as np
import pytest
import requests
from mnist1d.data import get_dataset_args, make_dataset

from fljax import ExperimentConfig, FljaxError, build
from fljax.data import loaders
from fljax.data.loaders import load_dataset, load_mnist1d


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """Refuse (and record) every network call; run in an empty directory to see files written."""
    attempts = []

    def refuse(*args, **kwargs):
        attempts.append(args)
        raise OSError("network disabled in this test")

    for owner, name in ((socket.socket, "connect"), (socket, "create_connection"),
                        (socket, "getaddrinfo"), (urllib.request, "urlopen"), (requests, "get"),
                        (requests.Session, "request")):
        monkeypatch.setattr(owner, name, refuse)
    monkeypatch.chdir(tmp_path)
    yield attempts
    assert os.listdir(tmp_path) == []


def test_loads_offline_as_the_package_makes_it(offline):
    ds = load_mnist1d(400, seed=7)
    assert offline == []
    assert ds.name == "mnist1d_400" and ds.num_classes == 10 and ds.user_train is None
    assert ds.x_train.shape == (400, 40, 1) and ds.x_test.shape == (100, 40, 1)
    assert ds.x_train.dtype == ds.x_test.dtype == np.float32
    assert ds.y_train.dtype == ds.y_test.dtype == np.int32
    np.testing.assert_array_equal(np.bincount(np.concatenate([ds.y_train, ds.y_test])), [50] * 10)
    args = get_dataset_args()
    args.num_samples, args.seed = 500, 7
    package = make_dataset(args)   # its own 80/20 split of 500 examples
    np.testing.assert_array_equal(ds.x_train[..., 0], package["x"].astype(np.float32))
    np.testing.assert_array_equal(ds.x_test[..., 0], package["x_test"].astype(np.float32))
    np.testing.assert_array_equal(ds.y_train, package["y"])
    np.testing.assert_array_equal(ds.y_test, package["y_test"])
    # standardised over the whole set, as make_dataset does
    both = np.concatenate([ds.x_train, ds.x_test])
    assert abs(both.mean()) < 1e-5 and both.std() == pytest.approx(1.0, abs=1e-5)


def test_seeded_and_leaves_the_global_generators_alone():
    np.random.seed(123)
    expected = np.random.random()
    np.random.seed(123)
    a = load_mnist1d(80, seed=1)
    assert np.random.random() == expected
    b, c = load_mnist1d(80, seed=1), load_mnist1d(80, seed=2)
    np.testing.assert_array_equal(a.x_train, b.x_train)
    np.testing.assert_array_equal(a.y_test, b.y_test)
    assert not np.array_equal(a.x_train, c.x_train)


def test_names(monkeypatch):
    calls = []
    monkeypatch.setattr(loaders, "load_mnist1d", lambda n: calls.append(n))
    load_dataset("mnist1d")
    load_dataset("mnist1d_1600")
    assert calls == [4000, 1600]


@pytest.mark.parametrize("name, message", [("mnist1d_100", "positive multiple of 8, got 100"),
                                           ("mnist1d_0", "positive multiple of 8, got 0"),
                                           ("mnist1d_x", "named mnist1d or mnist1d_N"),
                                           ("mnist1d-400", "named mnist1d or mnist1d_N")])
def test_bad_names(name, message):
    with pytest.raises(FljaxError, match=message) as info:
        load_dataset(name)
    assert "\n" not in str(info.value)


def test_cnn1d_trains_on_non_iid_clients():
    config = ExperimentConfig(dataset="mnist1d_400", partition="classes", classes_per_client=2,
                              num_clients=10, clients_per_round=5, model="cnn1d", local_steps=10,
                              local_epochs=None, batch_size=32, lr=0.3, rounds=8)
    experiment = build(config)
    assert experiment.model.groups == ("conv1", "conv2", "conv3", "linear")
    state = experiment.initial_state()
    before = experiment.evaluate(state.params)
    losses = []
    for _ in range(config.rounds):
        state, metrics = experiment.round_fn(state)
        losses.append(float(metrics["train_loss"]))
    after = experiment.evaluate(state.params)
    assert losses[-1] < 0.9 * losses[0]
    assert after["loss"] < before["loss"] and after["accuracy"] > before["accuracy"]
