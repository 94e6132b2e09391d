"""IDX files (MNIST, Fashion-MNIST, EMNIST as their authors ship them): written, read back exactly."""

import gzip
import os

import numpy as np
import pytest

from fljax.data import loaders
from fljax.data.idx import DEBIAN_FASHION_MNIST, has_idx, parse_idx, read_idx, write_idx
from fljax.errors import FljaxError


def _write_set(directory, prefix, arrays, gz):
    names = {"train_x": "train-images-idx3-ubyte", "train_y": "train-labels-idx1-ubyte",
             "test_x": "t10k-images-idx3-ubyte", "test_y": "t10k-labels-idx1-ubyte"}
    for key, stem in names.items():
        write_idx(os.path.join(directory, prefix + stem + (".gz" if gz else "")), arrays[key])


def _arrays(seed=0, n=(7, 5), size=(28, 28)):
    rng = np.random.default_rng(seed)
    return {"train_x": rng.integers(0, 256, (n[0], *size), dtype=np.uint8),
            "train_y": rng.integers(0, 10, n[0], dtype=np.uint8),
            "test_x": rng.integers(0, 256, (n[1], *size), dtype=np.uint8),
            "test_y": rng.integers(0, 10, n[1], dtype=np.uint8)}


@pytest.mark.parametrize("gz", [False, True])
def test_idx_bytes_are_the_format(tmp_path, gz):
    images = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    path = str(tmp_path / ("x.idx" + (".gz" if gz else "")))
    write_idx(path, images)
    raw = gzip.open(path).read() if gz else open(path, "rb").read()
    # magic 0000 0803, sizes 2, 3, 4 big-endian, then the bytes in C order
    assert raw == (bytes([0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 4]) + images.tobytes())
    back = read_idx(path)
    assert back.dtype == np.uint8 and np.array_equal(back, images)
    for dtype in (np.int8, np.int16, np.int32, np.float32, np.float64):
        values = np.arange(-3, 3).astype(dtype).reshape(2, 3)
        write_idx(path, values)
        assert read_idx(path).dtype == dtype and np.array_equal(read_idx(path), values)


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("name", ["mnist", "fashion_mnist"])
def test_mnist_layout_loads_exactly(tmp_path, gz, name):
    arrays = _arrays()
    _write_set(str(tmp_path), "", arrays, gz)
    ds = loaders.load_dataset(name, data_dir=str(tmp_path))
    assert ds.name == name and ds.x_train.shape == (7, 28, 28, 1) and ds.x_train.dtype == np.float32
    np.testing.assert_array_equal(ds.x_train[..., 0], arrays["train_x"].astype(np.float32) / 255)
    np.testing.assert_array_equal(ds.x_test[..., 0], arrays["test_x"].astype(np.float32) / 255)
    np.testing.assert_array_equal(ds.y_train, arrays["train_y"])
    np.testing.assert_array_equal(ds.y_test, arrays["test_y"])
    assert ds.y_train.dtype == np.int32
    assert ds.num_classes == max(arrays["train_y"].max(), arrays["test_y"].max()) + 1


def test_emnist_images_are_transposed_back(tmp_path):
    arrays = _arrays(1, size=(28, 28))
    stored = {k: (v.transpose(0, 2, 1) if k.endswith("_x") else v) for k, v in arrays.items()}
    _write_set(str(tmp_path), "emnist-letters-", stored, gz=True)
    ds = loaders.load_dataset("emnist_letters", data_dir=str(tmp_path))
    np.testing.assert_array_equal(ds.x_train[..., 0], arrays["train_x"].astype(np.float32) / 255)
    np.testing.assert_array_equal(ds.x_test[..., 0], arrays["test_x"].astype(np.float32) / 255)
    # a non-square image pins the axis order: the stored [N, W, H] reads as [N, H, W]
    arrays = _arrays(2, size=(3, 5))
    stored = {k: (v.transpose(0, 2, 1) if k.endswith("_x") else v) for k, v in arrays.items()}
    _write_set(str(tmp_path), "emnist-digits-", stored, gz=False)
    ds = loaders.load_dataset("emnist_digits", data_dir=str(tmp_path))
    assert ds.x_train.shape == (7, 3, 5, 1)
    np.testing.assert_array_equal(ds.x_train[..., 0], arrays["train_x"].astype(np.float32) / 255)


def test_emnist_balanced_is_mapped_to_minus_one_one(tmp_path):
    arrays = _arrays(3)
    _write_set(str(tmp_path), "emnist-balanced-", arrays, gz=True)
    ds = loaders.load_dataset("emnist_balanced", data_dir=str(tmp_path))
    expected = (arrays["train_x"].transpose(0, 2, 1).astype(np.float32) / 255 - 0.5) / 0.5
    np.testing.assert_allclose(ds.x_train[..., 0], expected, rtol=0, atol=1e-6)


def _one_line(excinfo):
    text = str(excinfo.value)
    assert "\n" not in text
    return text


def test_bad_files_are_one_line_errors(tmp_path):
    path = str(tmp_path / "bad")
    with open(path, "wb") as f:
        f.write(bytes([0, 0, 0x42, 1, 0, 0, 0, 1, 7]))
    with pytest.raises(FljaxError) as e:
        read_idx(path)
    assert "magic number is 0000420" in _one_line(e) and "bad" in str(e.value)
    with open(path, "wb") as f:
        f.write(b"PK\x03\x04whatever")
    with pytest.raises(FljaxError, match="not an IDX file"):
        read_idx(path)
    write_idx(path, np.zeros((4, 28, 28), np.uint8))
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[:-10])
    with pytest.raises(FljaxError) as e:
        read_idx(path)
    assert "truncated" in _one_line(e) and "3136 data bytes, it has 3126" in str(e.value)
    with pytest.raises(FljaxError, match="truncated"):
        parse_idx(bytes([0, 0, 8, 3, 0, 0]))
    gz = str(tmp_path / "bad.gz")
    with gzip.open(gz, "wb") as f:
        f.write(data)
    with open(gz, "r+b") as f:
        f.truncate(40)                       # a cut gzip stream
    with pytest.raises(FljaxError) as e:
        read_idx(gz)
    assert "cannot read IDX file" in _one_line(e)
    with open(gz, "wb") as f:
        f.write(b"not gzip at all")
    with pytest.raises(FljaxError) as e:
        read_idx(gz)
    _one_line(e)


def test_missing_files(tmp_path):
    with pytest.raises(FljaxError, match="needs --data-dir"):
        loaders.load_dataset("emnist_letters")
    with pytest.raises(FljaxError) as e:
        loaders.load_dataset("emnist_letters", data_dir=str(tmp_path))
    assert "emnist-letters-train-images-idx3-ubyte" in _one_line(e)
    # mnist without its IDX files is a tfds dataset, as before
    assert not has_idx("mnist", str(tmp_path))
    with pytest.raises(FljaxError, match="tfds build mnist"):
        loaders.load_dataset("mnist", data_dir=str(tmp_path / "nowhere"))


@pytest.mark.skipif(not has_idx("fashion_mnist", DEBIAN_FASHION_MNIST),
                    reason=f"Fashion-MNIST is not installed in {DEBIAN_FASHION_MNIST} "
                           f"(apt-get install dataset-fashion-mnist)")
def test_real_fashion_mnist():
    ds = loaders.load_dataset("fashion_mnist")      # Debian's files, no --data-dir
    assert ds.x_train.shape == (60000, 28, 28, 1) and ds.x_test.shape == (10000, 28, 28, 1)
    assert ds.num_classes == 10
    assert np.array_equal(np.bincount(ds.y_train), [6000] * 10)
    assert np.array_equal(np.bincount(ds.y_test), [1000] * 10)
    assert 0.0 <= ds.x_train.min() and ds.x_train.max() == 1.0
    same = loaders.load_dataset("fashion_mnist", data_dir=DEBIAN_FASHION_MNIST)
    assert np.array_equal(same.x_test, ds.x_test)
