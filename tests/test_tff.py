"""TensorFlow Federated's HDF5 datasets: small files in TFF's layout read back exactly, clients
as natural users."""

import os

import h5py
import numpy as np
import pytest

from fljax.data import loaders
from fljax.data.leaf import LETTERS
from fljax.data.tff import load_tff
from fljax.errors import FljaxError


def write_tff(path, clients):
    """TFF's HDF5ClientData layout: examples/<client id>/<key> arrays."""
    with h5py.File(path, "w") as f:
        for client, arrays in clients.items():
            group = f.create_group(f"examples/{client}")
            for key, value in arrays.items():
                if key == "snippets":
                    group.create_dataset(key, data=np.array(value, dtype=object),
                                         dtype=h5py.string_dtype())
                else:
                    group.create_dataset(key, data=value)


def emnist_clients(rng, names, sizes, classes=62):
    return {c: {"label": rng.integers(0, classes, n).astype(np.int32),
                "pixels": rng.random((n, 28, 28)).astype(np.float32)}
            for c, n in zip(names, sizes)}


def test_emnist_clients_are_users_in_client_id_order(tmp_path):
    rng = np.random.default_rng(0)
    train = emnist_clients(rng, ["f0002_41", "f0000_14", "f0001_35"], [5, 3, 4])
    test = emnist_clients(rng, ["f0001_35", "f0000_14", "f9999_99"], [2, 1, 3])
    write_tff(tmp_path / "fed_emnist_train.h5", train)
    write_tff(tmp_path / "fed_emnist_test.h5", test)
    ds = loaders.load_dataset("tff_emnist", data_dir=str(tmp_path))
    order = ["f0000_14", "f0001_35", "f0002_41"]                     # sorted client ids
    assert ds.num_classes == 62 and ds.x_train.shape == (12, 28, 28, 1)
    np.testing.assert_array_equal(ds.user_train, [0] * 3 + [1] * 4 + [2] * 5)
    np.testing.assert_array_equal(ds.x_train[..., 0],
                                  np.concatenate([train[c]["pixels"] for c in order]))
    np.testing.assert_array_equal(ds.y_train, np.concatenate([train[c]["label"] for c in order]))
    # test examples keep their writer; a writer without training examples is dropped
    np.testing.assert_array_equal(ds.user_test, [0, 1, 1])
    np.testing.assert_array_equal(ds.x_test[..., 0], np.concatenate(
        [test["f0000_14"]["pixels"], test["f0001_35"]["pixels"]]))
    np.testing.assert_array_equal(ds.y_test, np.concatenate(
        [test["f0000_14"]["label"], test["f0001_35"]["label"]]))


def test_emnist_digits_only_files(tmp_path):
    rng = np.random.default_rng(1)
    for split in ("train", "test"):
        write_tff(tmp_path / f"fed_emnist_digitsonly_{split}.h5",
                  emnist_clients(rng, ["a", "b"], [3, 2], classes=10))
    ds = loaders.load_dataset("tff_emnist_digits", data_dir=str(tmp_path))
    assert ds.num_classes == 10 and len(ds.y_train) == 5 and ds.name == "tff_emnist_digits"


def test_cifar100_fine_and_coarse_labels(tmp_path):
    rng = np.random.default_rng(2)
    make = lambda n: {"image": rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8),
                      "label": rng.integers(0, 100, n), "coarse_label": rng.integers(0, 20, n)}
    train = {str(i): make(n) for i, n in enumerate([3, 2, 4])}
    test = {str(i): make(n) for i, n in enumerate([2, 1])}
    write_tff(tmp_path / "fed_cifar100_train.h5", train)
    write_tff(tmp_path / "fed_cifar100_test.h5", test)
    raw = load_tff("tff_cifar100", str(tmp_path))
    np.testing.assert_array_equal(raw.x_train, np.concatenate(
        [train[c]["image"] for c in "012"]).astype(np.float32) / np.float32(255))
    np.testing.assert_array_equal(raw.y_train, np.concatenate([train[c]["label"] for c in "012"]))
    np.testing.assert_array_equal(raw.user_train, [0, 0, 0, 1, 1, 2, 2, 2, 2])
    assert raw.user_test is None and len(raw.y_test) == 3 and raw.num_classes == 100
    coarse = load_tff("tff_cifar100_coarse", str(tmp_path))
    assert coarse.num_classes == 20
    np.testing.assert_array_equal(coarse.y_train, np.concatenate(
        [train[c]["coarse_label"] for c in "012"]))
    np.testing.assert_array_equal(coarse.x_train, raw.x_train)
    ds = loaders.load_dataset("tff_cifar100", data_dir=str(tmp_path))   # standardized
    mean, std = loaders.CHANNEL_STATS["cifar100"]
    np.testing.assert_allclose(ds.x_train, (raw.x_train - np.float32(mean)) / np.float32(std),
                               rtol=1e-6)


def test_shakespeare_snippets_become_next_character_blocks(tmp_path):
    long = "".join(LETTERS[i % len(LETTERS)] for i in range(200))
    train = {"THE_TRAGEDY_OF_KING_LEAR_KENT": {"snippets": [long.encode(), b"A"]},
             "ALLS_WELL_THAT_ENDS_WELL_CLOWN": {"snippets": ["So~ \u00e9x".encode()]}}
    test = {"ALLS_WELL_THAT_ENDS_WELL_CLOWN": {"snippets": [b"x" * 82]}}
    write_tff(tmp_path / "shakespeare_train.h5", train)
    write_tff(tmp_path / "shakespeare_test.h5", test)
    ds = loaders.load_dataset("tff_shakespeare", data_dir=str(tmp_path))
    assert ds.num_classes == len(LETTERS) and ds.x_train.shape == (4, 80)
    space = LETTERS.index(" ")
    ids = lambda text: [LETTERS.index(c) if c in LETTERS else space for c in text]
    # users sorted: ALLS_WELL... (0) then THE_TRAGEDY... (1)
    np.testing.assert_array_equal(ds.user_train, [0, 1, 1, 1])
    clown = ids("So~ \u00e9x")                            # '~' and 'é' are outside: spaces
    assert ds.x_train[0, :5].tolist() == clown[:5] and ds.y_train[0, :5].tolist() == clown[1:]
    assert set(ds.x_train[0, 5:]) == {space} and set(ds.y_train[0, 5:]) == {-1}
    lear = ids(long)                                       # blocks of 81: 0-80, 81-161, 162-199
    for b, start in enumerate((0, 81, 162)):
        block = lear[start:start + 81]
        x, y = ds.x_train[1 + b], ds.y_train[1 + b]
        assert x[:len(block) - 1].tolist() == block[:-1]
        assert y[:len(block) - 1].tolist() == block[1:]    # y[t] = the character after x[t]
        assert set(y[len(block) - 1:].tolist()) <= {-1}
    # 'A' alone has no next character: no example; 82 x's: one full block, then one x (dropped)
    assert ds.x_test.shape == (1, 80) and ds.y_test[0].tolist() == ids("x" * 80)
    np.testing.assert_array_equal(ds.user_test, [0])


def test_missing_and_bad_files_are_one_line_errors(tmp_path):
    with pytest.raises(FljaxError) as e:
        loaders.load_dataset("tff_emnist", data_dir=str(tmp_path))
    text = str(e.value)
    assert "\n" not in text and "fed_emnist_train.h5" in text
    assert "https://storage.googleapis.com/tff-datasets-public/fed_emnist.tar.bz2" in text
    with pytest.raises(FljaxError, match="no --data-dir given.*shakespeare.tar.bz2"):
        loaders.load_dataset("tff_shakespeare")
    for split in ("train", "test"):
        (tmp_path / f"fed_cifar100_{split}.h5").write_bytes(b"not hdf5")
    with pytest.raises(FljaxError) as e:
        loaders.load_dataset("tff_cifar100", data_dir=str(tmp_path))
    assert "cannot read" in str(e.value) and "\n" not in str(e.value)
    with h5py.File(tmp_path / "fed_cifar100_train.h5", "w") as f:
        f.create_dataset("pixels", data=np.zeros(3))
    with pytest.raises(FljaxError, match="no 'examples' group"):
        loaders.load_dataset("tff_cifar100", data_dir=str(tmp_path))
    write_tff(tmp_path / "fed_emnist_train.h5", {"a": {"pixels": np.zeros((2, 28, 28))}})
    write_tff(tmp_path / "fed_emnist_test.h5", {"a": {"pixels": np.zeros((2, 28, 28))}})
    with pytest.raises(FljaxError, match="lacks"):
        loaders.load_dataset("tff_emnist", data_dir=str(tmp_path))


def test_tff_emnist_trains_with_natural_partition(tmp_path):
    from fljax.runner.cli import main

    rng = np.random.default_rng(3)
    for split in ("train", "test"):
        write_tff(tmp_path / f"fed_emnist_{split}.h5",
                  emnist_clients(rng, ["w0", "w1", "w2"], [6, 5, 4]))
    out = tmp_path / "run"
    code = main(["--dataset", "tff_emnist", "--data-dir", str(tmp_path), "--partition",
                 "natural", "--num-clients", "3", "--clients-per-round", "3", "--rounds", "1",
                 "--batch-size", "2", "--local-steps", "1", "--quiet", "--out-dir", str(out)])
    assert code == 0 and os.path.isdir(out)
