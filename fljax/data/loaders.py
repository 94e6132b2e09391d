"""Classification datasets as numpy arrays; fljax downloads nothing unless asked (``--download``).

* ``digits``: scikit-learn's 8x8 digits, shipped inside scikit-learn (offline, 1797 images).
* ``mnist1d``, ``mnist1d_N``: MNIST-1D (Greydanus, 2020), 1-D signals generated offline by the
  ``mnist1d`` package.
* ``synthetic_ALPHA_BETA``, ``synthetic_iid``: FedProx's synthetic federated data, generated
  (:mod:`fljax.data.synthetic`); it comes with its users.
* any tensorflow-datasets name (``mnist``, ``cifar10``, ``emnist/letters`` ...): read from a
  data directory where it was prepared beforehand in the ``array_record`` format, via
  ``tfds.data_source`` (no tensorflow needed to read).
"""

from __future__ import annotations

import functools
import numbers
import os
import random
import re
import zipfile

import numpy as np

from fljax.data.dataset import Dataset
from fljax.data.idx import DEBIAN_FASHION_MNIST, has_idx, idx_names, load_idx_dataset
from fljax.data.graphs import SPLITS, federated_graph_dataset, load_planetoid
from fljax.data.leaf import load_leaf, load_user_npz
from fljax.data.synthetic import load_synthetic
from fljax.data.text import load_sst2
from fljax.data.tff import TFF_DATASETS, load_tff
from fljax.data.tiny_imagenet import load_tiny_imagenet
from fljax.data.tfds_files import first_line, open_split, prepare_hint, read_split
from fljax import registry
from fljax.errors import FljaxError


def load_digits(*, test_fraction: float = 0.2, seed: int = 0) -> Dataset:
    """scikit-learn's digits as [N, 8, 8, 1] float32 in [0, 1], with a stratified seeded split."""
    # imported here, not at the top: scikit-learn takes about half a second to import, and only
    # this dataset needs it
    from sklearn.datasets import load_digits as sk_load_digits
    from sklearn.model_selection import train_test_split

    if not 0.0 < test_fraction < 1.0:
        raise FljaxError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    digits = sk_load_digits()
    x = (digits.images / 16.0).astype(np.float32)[..., None]
    y = digits.target.astype(np.int32)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=test_fraction, random_state=seed, stratify=y
    )
    return Dataset("digits", x_train, y_train, x_test, y_test, 10)


MNIST1D_TRAIN = 4000   # the package's standard dataset: 4000 train, 1000 test examples


def load_mnist1d(num_train: int = MNIST1D_TRAIN, *, seed: int = 42) -> Dataset:
    """MNIST-1D (Greydanus, 2020): the ten digits as 40-sample 1-D signals, x [N, 40, 1] float32.

    Generated offline by the ``mnist1d`` package's ``make_dataset`` from its ten templates
    (random padding, scaling, translation, correlated and i.i.d. noise, shear, resampling to 40
    points; then the whole set is standardised), never by its ``get_dataset``, which downloads.
    ``num_train`` training and ``num_train / 4`` test examples, the package's 80/20 split:
    ``make_dataset`` makes ``5/4 num_train`` examples, the same number per class (so num_train
    must be a multiple of 8), shuffled, and the first ``num_train`` are the training set. The
    defaults give the package's standard dataset (4000 / 1000, its seed 42).

    ``make_dataset`` seeds numpy's and Python's global random generators; their states are
    restored afterwards. It takes about 0.75 ms per example on one CPU core (4 s for the
    default), so nothing is cached on disk.
    """
    if isinstance(num_train, bool) or not isinstance(num_train, numbers.Integral) or (
            num_train < 8 or num_train % 8):
        raise FljaxError(f"mnist1d needs a number of training examples that is a positive "
                         f"multiple of 8, got {num_train!r}")
    return _generated_mnist1d(int(num_train), seed)


@functools.lru_cache(maxsize=4)
def _generated_mnist1d(num_train: int, seed: int) -> Dataset:
    """load_mnist1d's dataset, generated once per process (sweeps build many runs of it); its
    arrays are read-only, so no caller can change another's copy."""
    try:  # imported here: mnist1d is an optional package, needed by this dataset alone
        from mnist1d.data import get_dataset_args, make_dataset
    except ImportError:
        raise FljaxError("dataset mnist1d needs the mnist1d package: pip install "
                         "mnist1d==0.0.2.post1") from None
    args = get_dataset_args()
    args.num_samples = num_train * 5 // 4
    args.seed = seed
    numpy_state, python_state = np.random.get_state(), random.getstate()
    try:
        data = make_dataset(args)
    finally:
        np.random.set_state(numpy_state)
        random.setstate(python_state)
    x = np.concatenate([data["x"], data["x_test"]]).astype(np.float32)[..., None]
    y = np.concatenate([data["y"], data["y_test"]]).astype(np.int32)
    for array in (x, y):
        array.flags.writeable = False
    name = "mnist1d" if num_train == MNIST1D_TRAIN else f"mnist1d_{num_train}"
    return Dataset(name, x[:num_train], y[:num_train], x[num_train:], y[num_train:], 10)


def _to_float_images(x: np.ndarray, name: str, normalize: bool) -> np.ndarray:
    if x.ndim == 3:
        x = x[..., None]
    if x.ndim != 4:
        raise FljaxError(f"dataset {name!r} images must be [N, H, W] or [N, H, W, C], got shape {x.shape}")
    if normalize and x.dtype == np.uint8:
        return x.astype(np.float32) / np.float32(255.0)
    return x.astype(np.float32)


def load_tfds(
    name: str,
    *,
    data_dir,
    train_split: str = "train",
    test_split: str = "test",
    image_key: str = "image",
    label_key: str = "label",
    normalize: bool = True,
    download: bool = False,
) -> Dataset:
    """Read a tensorflow-datasets dataset prepared (array_record) in ``data_dir``.

    Downloads only with ``download`` (the ``--download`` flag): then a dataset not prepared
    there is downloaded and prepared by its tfds builder (``download_and_prepare``, array_record
    format) first; without it a missing dataset raises FljaxError saying how to prepare it and
    naming ``--download``. uint8 images
    become float32 in [0, 1] when ``normalize``; [N, H, W] images get a channel axis.
    ``num_classes`` comes from the label feature, else from the largest label + 1.
    """
    if data_dir is None:
        raise FljaxError(f"dataset {name!r} needs data_dir, the directory holding the prepared tfds data")
    data_dir = os.fspath(data_dir)
    if download:
        download_and_prepare(name, data_dir)
    if not os.path.isdir(data_dir):
        raise FljaxError(
            f"dataset {name!r} is not prepared in '{data_dir}' (no such directory); "
            f"{prepare_hint(name, data_dir)}"
        )
    import tensorflow_datasets as tfds  # slow to import: only when a tfds dataset is asked for

    arrays = []
    info = None
    for split in (train_split, test_split):
        source = open_split(tfds, name, split, data_dir)
        info = getattr(source, "dataset_info", info)
        x, y = read_split(source, name, split, image_key, label_key)
        arrays += [_to_float_images(x, name, normalize), y.astype(np.int32)]
    x_train, y_train, x_test, y_test = arrays

    num_classes = None
    try:
        num_classes = int(info.features[label_key].num_classes)
    except (AttributeError, KeyError, TypeError):
        pass
    if not num_classes:
        num_classes = int(max(y_train.max(), y_test.max())) + 1
    return Dataset(name, x_train, y_train, x_test, y_test, num_classes)


def download_and_prepare(name: str, data_dir: str) -> None:
    """Let tfds download and prepare dataset ``name`` in ``data_dir`` (array_record) unless it is
    prepared there already; a failure is a one-line FljaxError."""
    import tensorflow_datasets as tfds

    try:
        builder = tfds.builder(name, data_dir=data_dir, file_format="array_record")
        if not builder.is_prepared():
            builder.download_and_prepare()
    except FljaxError:
        raise
    except Exception as err:     # unknown name, no network, a missing tfds dependency ...
        raise FljaxError(f"--download could not prepare dataset {name!r} in '{data_dir}': "
                         f"{first_line(err)}") from None


NPZ_KEYS = ("x_train", "y_train", "x_test", "y_test")


def load_npz(path: str) -> Dataset:
    """Your own arrays: an ``.npz`` file with x_train [N,H,W,C] or [N,H,W], y_train [N] integer
    labels, x_test, y_test. The number of classes is the largest label + 1 (at most N)."""
    if not os.path.isfile(path):
        raise FljaxError(f"dataset file {path!r} does not exist")
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise FljaxError(f"dataset file {path!r} is not a readable .npz file ({first_line(e)})") from None
    missing = [k for k in NPZ_KEYS if k not in arrays]
    if missing:
        raise FljaxError(f"dataset file {path!r} lacks array(s) {missing}; it needs {list(NPZ_KEYS)}")
    name = os.path.basename(path)
    for split in ("train", "test"):
        x, y = arrays[f"x_{split}"], arrays[f"y_{split}"]
        if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
            raise FljaxError(f"y_{split} in {path!r} must be a 1-D integer array, got shape {y.shape} dtype {y.dtype}")
        if len(x) != len(y):
            raise FljaxError(f"x_{split} and y_{split} in {path!r} have different lengths ({len(x)} vs {len(y)})")
        if len(y) == 0:
            raise FljaxError(f"x_{split} in {path!r} is empty")
        if y.min() < 0:
            raise FljaxError(f"y_{split} in {path!r} has negative labels (min {y.min()})")
        if np.issubdtype(x.dtype, np.floating) and not np.all(np.isfinite(x)):
            raise FljaxError(f"x_{split} in {path!r} contains {int((~np.isfinite(x)).sum())} NaN or Inf values")
    x_train = _to_float_images(arrays["x_train"], name, normalize=True)
    x_test = _to_float_images(arrays["x_test"], name, normalize=True)
    if x_train.shape[1:] != x_test.shape[1:]:
        raise FljaxError(f"x_train and x_test in {path!r} have different example shapes "
                         f"({x_train.shape[1:]} vs {x_test.shape[1:]})")
    num_classes = int(arrays["y_train"].max()) + 1
    if num_classes > len(arrays["y_train"]):
        raise FljaxError(f"y_train in {path!r} has label {num_classes - 1}: labels must be class "
                         f"indices 0..C-1, and C cannot exceed the {len(arrays['y_train'])} "
                         f"training examples")
    if arrays["y_test"].max() >= num_classes:
        raise FljaxError(f"y_test in {path!r} has label {arrays['y_test'].max()} not seen in y_train "
                         f"(labels 0..{num_classes - 1})")
    return Dataset(name, x_train, arrays["y_train"].astype(np.int32), x_test,
                   arrays["y_test"].astype(np.int32), num_classes)


# Per-channel (mean, std) applied once, before training, to images in [0, 1], as the papers' code
# does: the FedDyn-family code standardizes CIFAR (and ImageNet-32, the public data of
# feddyn-as-init's Figure 7, by torchvision's ImageNet values); FedGA's code (epfml/GradientAlignment, EMNIST
# balanced: ToTensor + Normalize((0.5,), (0.5,))) maps EMNIST to [-1, 1]; Tiny-ImageNet by its
# training set's channel statistics (FedBug states no normalization); pFL-Bench (FedDecay's
# FEMNIST, feddecay/femnist--s02) normalizes LEAF's FEMNIST values by (0.1307, 0.3081).
CHANNEL_STATS = {"cifar10": ((0.491, 0.482, 0.447), (0.247, 0.243, 0.262)),
                 "imagenet_resized/32x32": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
                 "cifar100": ((0.5071, 0.4867, 0.4408), (0.2675, 0.2565, 0.2761)),
                 "emnist/balanced": ((0.5,), (0.5,)),
                 "emnist_balanced": ((0.5,), (0.5,)),
                 "leaf/femnist": ((0.1307,), (0.3081,)),
                 "tiny_imagenet": ((0.4802, 0.4481, 0.3975), (0.2302, 0.2265, 0.2262))}


# tfds datasets whose test split has another name: ImageNet's held-out split is 'validation'.
TEST_SPLITS = {"imagenet_resized/32x32": "validation"}

_SYNTHETIC = re.compile(r"synthetic_(?:iid|(\d+(?:\.\d+)?)_(\d+(?:\.\d+)?))")
_MNIST1D = re.compile(r"mnist1d(?:_(\d+))?")


def validation_split(num_examples: int, fraction: float, seed: int
                     ) -> tuple[np.ndarray, np.ndarray]:
    """(kept, held): ascending ids of the training examples the clients keep and of a random
    ``fraction`` held out as a validation split for tuning, drawn by ``seed``, stratified by
    nothing (a uniform sample, so every user of a natural dataset keeps about 1 - fraction of
    its examples)."""
    if not 0 < fraction < 1:
        raise FljaxError(f"validation_fraction must be in (0, 1) to hold out a split, got "
                         f"{fraction}")
    order = np.random.default_rng(seed).permutation(num_examples)
    held = np.sort(order[:int(round(fraction * num_examples))])
    kept = np.sort(order[len(held):])
    if len(held) == 0 or len(kept) == 0:
        raise FljaxError(f"validation_fraction {fraction} of {num_examples} training examples "
                         f"leaves an empty split")
    return kept, held


def splits_users(name: str) -> bool:
    """Whether ``load_dataset(name, user_split=...)`` splits each user's data itself (a graph
    user's nodes); for every other dataset ``fljax.data.users`` splits examples."""
    return name.startswith("planetoid/")


def depends_on_seed(name: str) -> bool:
    """Whether ``load_dataset(name, seed=...)`` gives each seed other data (Planetoid's node
    split); every other dataset is the same for every seed."""
    return name.startswith("planetoid/")


def load_dataset(name: str, *, data_dir=None, num_clients: int = 5, seed: int = 0,
                 user_split: tuple[float, float] | None = None, download: bool = False,
                 sample_users: int = 0) -> Dataset:
    """A dataset by name; only tfds datasets need ``data_dir``; only tfds datasets download, and
    only with ``download``. ``sample_users`` > 0 keeps that many of a LEAF dataset's users (a
    fixed draw, the same for every run; other datasets take 0).

    - 'digits' -> :func:`load_digits`;
    - 'mnist1d' (4000 train / 1000 test) or 'mnist1d_N' (N train, N/4 test) -> :func:`load_mnist1d`
      with the package's seed 42;
    - 'synthetic_ALPHA_BETA' (e.g. synthetic_1_1, synthetic_0.5_0.5, synthetic_0_0) or
      'synthetic_iid' -> :func:`fljax.data.synthetic.load_synthetic` with 30 users and seed 0;
      every run of a name gets the same data, as the generated files of the FedProx code do (the
      Python functions take other seeds and sizes);
    - 'leaf/KIND' (femnist, shakespeare, sent140, synthetic) -> :func:`fljax.data.leaf.load_leaf`
      from ``data_dir``, the LEAF dataset's directory: clients are its users (partition natural);
      FEMNIST normalized as pFL-Bench does (CHANNEL_STATS);
    - 'tiny_imagenet' -> :func:`fljax.data.tiny_imagenet.load_tiny_imagenet` from ``data_dir``,
      the unpacked tiny-imagenet-200 folder (its labelled val split is the test split),
      standardized per channel;
    - 'mnist', 'fashion_mnist', 'emnist_SPLIT' (balanced, letters, ...) ->
      :func:`fljax.data.idx.load_idx_dataset` when ``data_dir`` holds their IDX files (plain or
      gzipped; fashion_mnist without ``data_dir`` reads Debian's dataset-fashion-mnist package,
      /usr/share/datasets/fashion-mnist, when installed); else mnist and fashion_mnist are tfds
      datasets (below);
    - 'tff_emnist', 'tff_emnist_digits', 'tff_shakespeare', 'tff_cifar100' (fine labels),
      'tff_cifar100_coarse' -> :func:`fljax.data.tff.load_tff`: TensorFlow Federated's HDF5
      files in ``data_dir``, clients as users (partition natural); CIFAR standardized per channel;
    - 'glue/sst2' -> :func:`fljax.data.text.load_sst2`: tfds from ``data_dir``, as token ids;
    - 'planetoid/NAME' (pubmed, cora, citeseer) -> Planetoid data from ``data_dir`` split into
      ``num_clients`` Louvain communities, one example (a subgraph) per client
      (:func:`fljax.data.graphs.federated_graph_dataset`, seeded by ``seed``; with
      ``user_split`` = (val, test fractions) each client's nodes split on their own, for
      per-user evaluation);
    - a path ending in .npz -> :func:`load_npz`, or :func:`fljax.data.leaf.load_user_npz` when it
      holds each example's user (``client_id_train``, ``client_id_test``);
    - a user's dataset (``fljax.registry``): a name given to ``fljax.register_dataset`` or an
      import path 'package.module:loader' -> :func:`own_dataset`;
    - any other name -> :func:`load_tfds` from ``data_dir`` (CIFAR standardized per channel and
      EMNIST balanced mapped to [-1, 1], CHANNEL_STATS).
    """
    if sample_users and not name.startswith("leaf/"):
        raise FljaxError(f"sample_users draws users of a LEAF dataset (leaf/KIND); dataset "
                         f"{name!r} takes sample_users 0, got {sample_users!r}")
    if registry.registered("dataset", name):
        return own_dataset(name, registry.lookup("dataset", name), data_dir=data_dir,
                           num_clients=num_clients, seed=seed)
    if name == "digits":
        return load_digits()
    if name.startswith("mnist1d"):
        match = _MNIST1D.fullmatch(name)
        if not match:
            raise FljaxError(f"unknown dataset {name!r}: MNIST-1D is named mnist1d or mnist1d_N "
                             f"(N training examples, a multiple of 8)")
        return load_mnist1d(int(match[1] or MNIST1D_TRAIN))
    if name.startswith("synthetic"):
        match = _SYNTHETIC.fullmatch(name)
        if not match:
            raise FljaxError(f"unknown dataset {name!r}: synthetic data is named "
                             f"synthetic_ALPHA_BETA (e.g. synthetic_1_1, synthetic_0.5_0.5) or "
                             f"synthetic_iid")
        if match[1] is None:
            return load_synthetic(iid=True)
        return load_synthetic(float(match[1]), float(match[2]))
    if name.startswith("leaf/"):
        if data_dir is None:
            raise FljaxError(f"dataset {name!r} needs --data-dir, the directory of the LEAF "
                             f"dataset (e.g. leaf/data/{name[5:]})")
        dataset = load_leaf(str(data_dir), name[5:], users=sample_users)
        if name in CHANNEL_STATS:
            dataset = normalize_channels(dataset, *CHANNEL_STATS[name])
        return dataset
    if name == "glue/sst2":
        return load_sst2(data_dir)
    if name.startswith("planetoid/"):
        if data_dir is None:
            raise FljaxError(f"dataset {name!r} needs --data-dir, the directory of the Planetoid "
                             f"files")
        if name[10:] not in SPLITS:
            raise FljaxError(f"unknown Planetoid dataset {name!r}; choose planetoid/pubmed, "
                             f"planetoid/cora or planetoid/citeseer")
        graph = load_planetoid(name[10:], str(data_dir))
        dataset, _ = federated_graph_dataset(graph, num_clients, seed=seed,
                                             split=SPLITS[name[10:]], user_split=user_split)
        return dataset._replace(name=name)
    if name in TFF_DATASETS:
        dataset = load_tff(name, data_dir)
        if name.startswith("tff_cifar100"):
            dataset = normalize_channels(dataset, *CHANNEL_STATS["cifar100"])
        return dataset
    if name == "tiny_imagenet":
        return normalize_channels(load_tiny_imagenet(data_dir), *CHANNEL_STATS[name])
    if name.endswith(".npz"):
        if os.path.isfile(name) and _has_users(name):
            return load_user_npz(name)
        return load_npz(name)
    if idx_names(name) is not None:
        directory = data_dir
        if directory is None and name == "fashion_mnist" and has_idx(name, DEBIAN_FASHION_MNIST):
            directory = DEBIAN_FASHION_MNIST
        directory = None if directory is None else os.path.expanduser(str(directory))
        if name.startswith("emnist_") or has_idx(name, directory):
            if directory is None:
                raise FljaxError(f"dataset {name!r} needs --data-dir, the directory of NIST's "
                                 f"EMNIST IDX files (emnist-{name[7:]}-train-images-idx3-ubyte.gz "
                                 f"...)")
            dataset = load_idx_dataset(name, directory)
            if name in CHANNEL_STATS:
                dataset = normalize_channels(dataset, *CHANNEL_STATS[name])
            return dataset
    if data_dir is None:
        close = registry.closest(name, OFFLINE_DATASETS + registry.names("dataset"))
        raise FljaxError(
            f"unknown dataset {name!r}; {close}the offline ones are {list(OFFLINE_DATASETS)}; "
            f"any other name is a tfds dataset, which needs --data-dir (its prepared data); or "
            f"your own: an import path 'module:loader', a name given to "
            f"fljax.register_dataset, or an .npz file")
    dataset = load_tfds(name, data_dir=os.path.expanduser(str(data_dir)),
                        test_split=TEST_SPLITS.get(name, "test"), download=download)
    if name in CHANNEL_STATS:
        dataset = normalize_channels(dataset, *CHANNEL_STATS[name])
    return dataset


# The names that load without a data directory (mnist1d_N and synthetic_A_B have more).
OFFLINE_DATASETS = ("digits", "mnist1d", "synthetic_iid", "synthetic_1_1")


def own_dataset(name: str, loader, **offered) -> Dataset:
    """A user's dataset: ``loader(data_dir=..., num_clients=..., seed=...)`` (the arguments its
    signature names) must return a ``fljax.data.Dataset`` (train and test arrays, the number of
    classes, and each example's user if it has users)."""
    import inspect

    accepted = inspect.signature(loader).parameters
    dataset = loader(**{k: v for k, v in offered.items() if k in accepted})
    if not isinstance(dataset, Dataset):
        raise FljaxError(f"dataset {name!r}: its loader must return a fljax.data.Dataset, got "
                         f"{type(dataset).__name__}")
    if len(dataset.x_train) != len(dataset.y_train) or len(dataset.x_test) != len(
            dataset.y_test):
        raise FljaxError(f"dataset {name!r}: x and y of a split must have one length, got "
                         f"train {len(dataset.x_train)} / {len(dataset.y_train)}, test "
                         f"{len(dataset.x_test)} / {len(dataset.y_test)}")
    return dataset


def _has_users(path: str) -> bool:
    try:
        with np.load(path, allow_pickle=False) as f:
            return "client_id_train" in f.files
    except (OSError, ValueError, EOFError, zipfile.BadZipFile):
        return False       # load_npz says what is wrong with the file


def normalize_channels(ds: Dataset, mean, std) -> Dataset:
    """Standardise each channel of train and test images: ``(x - mean) / std``.

    E.g. the FedDyn-code CIFAR-10 values mean=(0.491, 0.482, 0.447), std=(0.247, 0.243, 0.262).
    """
    channels = ds.x_train.shape[-1]
    mean = np.asarray(mean, dtype=np.float32).reshape(-1)
    std = np.asarray(std, dtype=np.float32).reshape(-1)
    if mean.shape != (channels,) or std.shape != (channels,):
        raise FljaxError(
            f"mean and std must have one value per channel ({channels}), "
            f"got {mean.tolist()} and {std.tolist()}"
        )
    if not np.all(std > 0):
        raise FljaxError(f"std must be > 0 for every channel, got {std.tolist()}")
    return ds._replace(x_train=(ds.x_train - mean) / std, x_test=(ds.x_test - mean) / std)
