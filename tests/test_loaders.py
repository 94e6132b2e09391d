import socket
import time

import numpy as np
import pytest

from fljax.data import loaders, tfds_files
from fljax.data.dataset import Dataset
from fljax.data.loaders import load_dataset, load_digits, load_tfds, normalize_channels
from fljax.errors import FljaxError

tfds = pytest.importorskip("tensorflow_datasets")


class FljaxTinyImages(tfds.core.GeneratorBasedBuilder):
    """A 3-class dataset of random 8x8 uint8 'images' stored as a Tensor feature: it can be built
    into array_record files without tensorflow (the Image feature needs tensorflow to encode PNGs)."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return tfds.core.DatasetInfo(
            builder=self,
            features=tfds.features.FeaturesDict(
                {
                    "image": tfds.features.Tensor(shape=(8, 8), dtype=np.uint8),
                    "label": tfds.features.ClassLabel(num_classes=3),
                }
            ),
        )

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(10), "test": self._generate_examples(4)}

    def _generate_examples(self, n):
        for i in range(n):
            yield i, {"image": np.full((8, 8), 25 * i, dtype=np.uint8), "label": i % 3}


@pytest.fixture
def no_network(monkeypatch):
    """Record (and refuse) every attempt to open a connection or resolve a name."""
    attempts = []

    def refuse(*args, **kwargs):
        attempts.append(args)
        raise OSError("network disabled in this test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    return attempts


def test_digits_shapes_dtypes_range():
    ds = load_digits()
    assert isinstance(ds, Dataset) and ds.name == "digits" and ds.num_classes == 10
    assert ds.x_train.shape[1:] == (8, 8, 1) and ds.x_test.shape[1:] == (8, 8, 1)
    assert len(ds.x_train) + len(ds.x_test) == 1797
    assert len(ds.x_test) == pytest.approx(0.2 * 1797, abs=1)
    assert ds.x_train.dtype == np.float32 and ds.y_train.dtype == np.int32 and ds.y_test.dtype == np.int32
    assert ds.x_train.min() >= 0.0 and ds.x_train.max() == 1.0
    assert set(np.unique(ds.y_test)) == set(range(10))  # stratified


def test_digits_split_reproducible():
    a, b, c = load_digits(seed=0), load_digits(seed=0), load_digits(seed=1)
    np.testing.assert_array_equal(a.x_train, b.x_train)
    np.testing.assert_array_equal(a.y_test, b.y_test)
    assert not np.array_equal(a.y_train, c.y_train)
    assert load_dataset("digits").x_train.shape == a.x_train.shape


def test_tfds_mock_mnist(tmp_path, no_network):
    with tfds.testing.mock_data(num_examples=8):
        ds = load_tfds("mnist", data_dir=tmp_path)
    assert ds.name == "mnist" and ds.num_classes == 10
    assert ds.x_train.shape == (8, 28, 28, 1) and ds.x_test.shape == (8, 28, 28, 1)
    assert ds.x_train.dtype == np.float32 and ds.y_train.dtype == np.int32
    assert 0.0 <= ds.x_train.min() and ds.x_train.max() <= 1.0
    assert ds.y_train.shape == (8,) and np.all((ds.y_train >= 0) & (ds.y_train < 10))
    assert no_network == []


def test_tfds_real_array_record(tmp_path, monkeypatch, no_network):
    FljaxTinyImages(data_dir=str(tmp_path), file_format="array_record").download_and_prepare()
    monkeypatch.setattr(tfds_files, "READ_CHUNK", 3)  # several batched reads, the last one partial
    ds = load_dataset("fljax_tiny_images", data_dir=tmp_path)
    assert ds.num_classes == 3
    assert ds.x_train.shape == (10, 8, 8, 1) and ds.x_test.shape == (4, 8, 8, 1)  # channel axis added
    assert ds.x_train.dtype == np.float32 and ds.y_train.dtype == np.int32
    index = np.rint(ds.x_train[:, 0, 0, 0] * 255 / 25).astype(int)  # tfds shuffles the records
    np.testing.assert_array_equal(np.sort(index), np.arange(10))
    np.testing.assert_allclose(ds.x_train[:, 0, 0, 0], 25 * index / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(ds.y_train, index % 3)  # images and labels stay paired
    raw = load_tfds("fljax_tiny_images", data_dir=tmp_path, normalize=False)
    assert raw.x_train.max() == 225.0
    with pytest.raises(FljaxError, match="'pixels'"):
        load_tfds("fljax_tiny_images", data_dir=tmp_path, image_key="pixels")
    with pytest.raises(FljaxError, match="'validation'"):
        load_tfds("fljax_tiny_images", data_dir=tmp_path, test_split="validation")
    assert no_network == []


@pytest.mark.parametrize("name", ["mnist", "fljax_tiny_images"])
def test_tfds_missing_dataset_fails_fast(tmp_path, name, no_network):
    start = time.perf_counter()
    with pytest.raises(FljaxError) as info:
        load_tfds(name, data_dir=tmp_path)
    assert time.perf_counter() - start < 5.0
    message = str(info.value)
    assert f"tfds build {name}" in message and str(tmp_path) in message and "\n" not in message
    assert list(tmp_path.iterdir()) == []  # nothing written
    assert no_network == []


def test_tfds_missing_directory_and_unknown_name(tmp_path, no_network):
    with pytest.raises(FljaxError, match="tfds build mnist") as info:
        load_tfds("mnist", data_dir=tmp_path / "nope")
    assert "nope" in str(info.value)
    start = time.perf_counter()
    with pytest.raises(FljaxError, match="unknown dataset 'no_such_dataset_xyz'"):
        load_tfds("no_such_dataset_xyz", data_dir=tmp_path)
    assert time.perf_counter() - start < 5.0
    assert no_network == []


def test_load_dataset_needs_data_dir():
    with pytest.raises(FljaxError, match="'mnist'.*--data-dir"):
        load_dataset("mnist", data_dir=None)


def test_normalize_channels():
    ds = load_digits()
    out = normalize_channels(ds, [0.5], [0.25])
    np.testing.assert_allclose(out.x_train, (ds.x_train - 0.5) / 0.25)
    assert out.x_test.dtype == np.float32 and out.y_train is ds.y_train
    with pytest.raises(FljaxError, match="one value per channel"):
        normalize_channels(ds, [0.5, 0.5, 0.5], [1.0, 1.0, 1.0])
    with pytest.raises(FljaxError, match="std must be > 0"):
        normalize_channels(ds, [0.5], [0.0])


def test_cifar_is_standardized_per_channel_as_in_the_feddyn_code(tmp_path, no_network):
    with tfds.testing.mock_data(num_examples=6):
        raw = load_tfds("cifar10", data_dir=tmp_path)
        ds = load_dataset("cifar10", data_dir=tmp_path)
    mean, std = loaders.CHANNEL_STATS["cifar10"]
    np.testing.assert_allclose(ds.x_train, (raw.x_train - np.array(mean)) / np.array(std),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(ds.y_test, raw.y_test)


def test_imagenet32_tests_on_its_validation_split_standardized_per_channel(tmp_path,
                                                                             no_network):
    """feddyn-as-init Figure 7's public data: ImageNet-1k at 32x32, held out = 'validation'."""
    with tfds.testing.mock_data(num_examples=6):
        raw = load_tfds("imagenet_resized/32x32", data_dir=tmp_path, test_split="validation")
        ds = load_dataset("imagenet_resized/32x32", data_dir=tmp_path)
    assert ds.num_classes == 1000 and ds.x_train.shape == (6, 32, 32, 3)
    mean, std = loaders.CHANNEL_STATS["imagenet_resized/32x32"]
    np.testing.assert_allclose(ds.x_test, (raw.x_test - np.array(mean)) / np.array(std),
                               rtol=1e-5, atol=1e-6)
    assert no_network == []


def test_emnist_balanced_is_normalized_to_minus_one_one_as_in_the_fedga_code(tmp_path, no_network):
    """FedGA's code: ToTensor (uint8 / 255) then Normalize((0.5,), (0.5,)): x / 127.5 - 1."""
    with tfds.testing.mock_data(num_examples=6):
        raw = load_tfds("emnist/balanced", data_dir=tmp_path, normalize=False)
        ds = load_dataset("emnist/balanced", data_dir=tmp_path)
    assert ds.num_classes == 47 and ds.x_train.shape == (6, 28, 28, 1)
    np.testing.assert_allclose(ds.x_train, raw.x_train / 127.5 - 1.0, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(ds.x_test, raw.x_test / 127.5 - 1.0, rtol=1e-6, atol=1e-6)
    assert -1.0 <= ds.x_train.min() < 0.0 < ds.x_train.max() <= 1.0
    assert no_network == []


def test_download_only_with_the_flag(tmp_path, monkeypatch, no_network):
    calls = []
    original = FljaxTinyImages.download_and_prepare

    def recorded(self, *args, **kwargs):
        calls.append((self.name, self.data_dir))
        return original(self, *args, **kwargs)     # this builder generates its data offline

    monkeypatch.setattr(FljaxTinyImages, "download_and_prepare", recorded)
    with pytest.raises(FljaxError) as info:                   # without --download: the error
        load_dataset("fljax_tiny_images", data_dir=tmp_path)
    assert "--download" in str(info.value) and "\n" not in str(info.value)
    assert calls == [] and list(tmp_path.iterdir()) == []
    ds = load_dataset("fljax_tiny_images", data_dir=tmp_path, download=True)
    assert len(calls) == 1 and calls[0][0] == "fljax_tiny_images"
    assert str(tmp_path) in calls[0][1] and ds.x_train.shape == (10, 8, 8, 1)
    load_dataset("fljax_tiny_images", data_dir=tmp_path, download=True)
    assert len(calls) == 1                                    # prepared: not again
    # the flag reaches the loader from the command line
    from fljax.runner.cli import main
    other = tmp_path / "other"
    code = main(["--dataset", "fljax_tiny_images", "--data-dir", str(other), "--download",
                 "--model", "mlp", "--num-clients", "2", "--clients-per-round", "2",
                 "--partition", "iid", "--rounds", "1", "--batch-size", "2", "--local-steps",
                 "1", "--quiet", "--out-dir", str(tmp_path / "run")])
    assert code == 0 and len(calls) == 2 and str(other) in calls[1][1]
    assert no_network == []


def test_download_asks_the_tfds_builder(tmp_path, monkeypatch, no_network):
    calls = []
    monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare",
                        lambda self, *a, **k: calls.append(self.name))
    with pytest.raises(FljaxError, match="not prepared"):   # the recorder prepared nothing
        load_dataset("mnist", data_dir=tmp_path, download=True)
    assert calls == ["mnist"] and no_network == []
