"""FedInit's noisy data (fljax.data.noise): x' = (1 + s_c e_i) * (x + s_b b_{i,y}) per client i and
class y (reading per_client: training copies only), and the reading shared (b_y for every client,
test images too), checked against float64 references from the draws; deterministic per seed; bad
input."""

import numpy as np
import pytest

from fljax import FljaxError
from fljax.runner.cli import main
from fljax.runner.config import ExperimentConfig
from fljax.data import loaders, noise
from fljax.runner.experiment import build

CONFIG = ExperimentConfig(num_clients=10, clients_per_round=4, partition="dirichlet_balanced",
                          replacement=True, dirichlet_alpha=0.1, seed=3, local_epochs=1,
                          rounds=1, eval_every=1, validation_fraction=0.1)


def client_examples(data, i):
    return np.asarray(data.x)[data.client_indices(i)], np.asarray(data.y)[data.client_indices(i)]


def test_per_client_class_offsets_differ_between_clients_and_spare_the_test_images():
    clean = build(CONFIG)
    noisy = build(CONFIG.replace(client_noise=0.3, class_noise=0.2))    # reading per_client
    raw = loaders.load_dataset("digits")
    e, _ = noise.draws(10, 10, 1, seed=3)
    b = noise.client_class_draws(10, 10, seed=3)
    assert b.shape == (10, 10) and np.all(np.abs(b[:, None, :] - b[None, :, :]).sum(-1)
                                          [~np.eye(10, dtype=bool)] > 0)   # no two clients alike
    for i in range(10):
        x, y = client_examples(clean.data, i)
        got, got_y = client_examples(noisy.data, i)
        expected = (1 + 0.3 * e[i]) * (x.astype(np.float64) + 0.2 * b[i, y][:, None, None, None])
        np.testing.assert_array_equal(got_y, y)
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(noisy.dataset.x_test, raw.x_test)    # test images untouched
    np.testing.assert_array_equal(noisy.dataset.x_train, raw.x_train)  # so is validation
    # the same example under two clients of one class: the offsets differ by client
    ids = [list(clean.data.client_indices(i)) for i in range(10)]
    i, j, n = next((i, j, n) for i in range(10) for j in range(i + 1, 10)
                   for n in set(ids[i]) & set(ids[j]))
    only_class = build(CONFIG.replace(class_noise=0.2))
    k = raw.y_train[n]
    diff = (client_examples(only_class.data, i)[0][ids[i].index(n)]
            - client_examples(only_class.data, j)[0][ids[j].index(n)])
    np.testing.assert_allclose(diff, 0.2 * (b[i, k] - b[j, k]), rtol=1e-5, atol=1e-6)
    again = build(CONFIG.replace(client_noise=0.3, class_noise=0.2))
    other = build(CONFIG.replace(client_noise=0.3, class_noise=0.2, seed=4))
    np.testing.assert_array_equal(np.asarray(again.data.x), np.asarray(noisy.data.x))
    assert not np.array_equal(noise.client_class_draws(10, 10, 4), b)
    assert not np.array_equal(np.asarray(other.data.x)[:50], np.asarray(noisy.data.x)[:50])


def test_each_client_and_class_get_the_stated_shift():
    clean = build(CONFIG)
    noisy = build(CONFIG.replace(client_noise=0.3, class_noise=0.2, class_noise_reading="shared"))
    raw = loaders.load_dataset("digits")
    e, b = noise.draws(10, 10, 1, seed=3)
    for i in range(10):
        x, y = client_examples(clean.data, i)
        got, got_y = client_examples(noisy.data, i)
        expected = (1 + 0.3 * e[i]) * (x.astype(np.float64) + 0.2 * b[y][:, None, None, None])
        np.testing.assert_array_equal(got_y, y)
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(noisy.dataset.x_test, raw.x_test.astype(np.float64)
                               + 0.2 * b[raw.y_test][:, None, None, None], rtol=1e-6, atol=1e-6)
    # a split with replacement lists an example under several clients: each has its own copy
    ids = [list(clean.data.client_indices(i)) for i in range(10)]
    i, j, example = next((i, j, n) for i in range(10) for j in range(i + 1, 10)
                         for n in set(ids[i]) & set(ids[j]))
    copy_i = client_examples(noisy.data, i)[0][ids[i].index(example)]
    copy_j = client_examples(noisy.data, j)[0][ids[j].index(example)]
    np.testing.assert_allclose(copy_i / copy_j, (1 + 0.3 * e[i, 0]) / (1 + 0.3 * e[j, 0]),
                               rtol=1e-5)


def test_the_noise_is_drawn_from_the_runs_seed():
    shared = dict(client_noise=0.3, class_noise=0.2, class_noise_reading="shared")
    first = build(CONFIG.replace(**shared))
    again = build(CONFIG.replace(**shared))
    other = build(CONFIG.replace(**shared, seed=4))
    np.testing.assert_array_equal(np.asarray(first.data.x), np.asarray(again.data.x))
    assert not np.array_equal(first.dataset.x_test, other.dataset.x_test)


def test_a_noisy_run_trains_through_the_cli(tmp_path, capsys):
    assert main(["--client-noise", "0.3", "--class-noise", "0.2", "--rounds", "1",
                 "--num-clients", "10", "--clients-per-round", "4", "--quiet",
                 "--out-dir", str(tmp_path / "r")]) == 0
    assert "final accuracy" in capsys.readouterr().out


@pytest.mark.parametrize("change, message", [
    (dict(client_noise=-0.1), "client_noise must be >= 0, got -0.1"),
    (dict(class_noise=float("inf")), "class_noise must be a finite number, got inf"),
    (dict(client_noise=0.1, user_test_fraction=0.2, partition="natural"),
     "client_noise copies each client's training images"),
    (dict(class_noise_reading="global"),
     r"class_noise_reading must be one of \('per_client', 'shared'\), got 'global'"),
])
def test_bad_noise_values_are_one_line(change, message):
    with pytest.raises(FljaxError, match=message):
        CONFIG.replace(**change).validate()


def test_noise_needs_images(capsys, tmp_path):
    code = main(["--dataset", "mnist1d", "--model", "cnn1d", "--class-noise", "0.1",
                 "--rounds", "1", "--quiet", "--out-dir", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "class_noise needs images [N, H, W, C]; dataset 'mnist1d' has inputs of shape" in err
