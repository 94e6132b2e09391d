"""TensorFlow Federated's federated datasets from their HDF5 files, clients as natural users.

TensorFlow Federated (TFF) shipped these datasets, before version 0.19, as HDF5 files read by its
``HDF5ClientData``: a top-level group ``examples`` with one group per client (named by its client
id), holding that client's arrays, one row per example. fljax reads them with h5py (never
downloads; the archives are at ``https://storage.googleapis.com/tff-datasets-public/``):

- ``tff_emnist`` (``fed_emnist_train.h5``, ``fed_emnist_test.h5``; archive ``fed_emnist.tar.bz2``)
  and ``tff_emnist_digits`` (``fed_emnist_digitsonly_*.h5``; ``fed_emnist_digitsonly.tar.bz2``):
  Federated EMNIST, LEAF's grouping of EMNIST by writer; ``pixels`` [n, 28, 28] float32 in
  [0, 1] (kept as stored), ``label`` [n]: 62 classes (10 digits-only). 3,400 (3,383) writers.
- ``tff_shakespeare`` (``shakespeare_{train,test}.h5``; ``shakespeare.tar.bz2``): 715 speaking
  roles; ``snippets`` [n] byte strings, each a role's line(s). A snippet becomes characters in
  LEAF's 80-letter vocabulary (``fljax.data.leaf.LETTERS``; outside it: the space) cut as
  TFF's Shakespeare baseline cuts it, into blocks of 81 characters (the last one shorter), and
  each block one example: x [80] its first 80 characters, y [80] the next character at every
  position (``y[t] = block[t + 1]``), as fljax's LEAF Shakespeare reader trains; positions past
  the end of a short block have x the space and y -1 (not scored). A block with no target (a
  single character) is dropped. TFF's baseline also adds beginning/end tokens, which LEAF's
  vocabulary lacks: fljax adds none.
- ``tff_cifar100`` / ``tff_cifar100_coarse`` (``fed_cifar100_{train,test}.h5``;
  ``fed_cifar100.tar.bz2``): CIFAR-100 split among 500 training clients by TFF's
  Pachinko-allocation partition; ``image`` [n, 32, 32, 3] uint8, ``label`` (100 fine classes) or
  ``coarse_label`` (20 superclasses, the ``_coarse`` name). The 100 test clients are other
  clients than the training ones, so the test set is one pool (no test users). fljax standardizes
  the images per channel as its ``cifar100`` (``fljax.data.loaders.CHANNEL_STATS``).

Users are numbered 0..U-1 in sorted client-id order (the order TFF lists them), over the clients
with training examples; for EMNIST and Shakespeare, whose test clients are the training clients
(each writer's examples split between the files), a test example's user is its client and test
examples of a client without training examples are dropped. Train with ``--partition natural
--num-clients U``.
"""

from __future__ import annotations

import os

import numpy as np

from fljax.data.dataset import Dataset
from fljax.data.leaf import LETTERS, SEQUENCE_LENGTH, _characters
from fljax.errors import FljaxError

URL = "https://storage.googleapis.com/tff-datasets-public/"
# name -> (file prefix, archive, input key, label key, classes, test clients are the training ones)
TFF_DATASETS = {
    "tff_emnist": ("fed_emnist", "fed_emnist.tar.bz2", "pixels", "label", 62, True),
    "tff_emnist_digits": ("fed_emnist_digitsonly", "fed_emnist_digitsonly.tar.bz2", "pixels",
                          "label", 10, True),
    "tff_shakespeare": ("shakespeare", "shakespeare.tar.bz2", "snippets", None, len(LETTERS),
                        True),
    "tff_cifar100": ("fed_cifar100", "fed_cifar100.tar.bz2", "image", "label", 100, False),
    "tff_cifar100_coarse": ("fed_cifar100", "fed_cifar100.tar.bz2", "image", "coarse_label", 20,
                            False),
}


def tff_files(name: str, data_dir) -> tuple[str, str]:
    """(train file, test file) of TFF dataset ``name`` in ``data_dir``; a missing one is a
    one-line FljaxError saying where TFF publishes it."""
    prefix, archive = TFF_DATASETS[name][:2]
    files = tuple(os.path.join(os.path.expanduser(str(data_dir or ".")), f"{prefix}_{split}.h5")
                  for split in ("train", "test"))
    missing = [f for f in files if not os.path.isfile(f)]
    if data_dir is None or missing:
        where = "no --data-dir given" if data_dir is None else f"no {missing[0]}"
        raise FljaxError(f"dataset {name!r} reads {prefix}_train.h5 and {prefix}_test.h5 from "
                         f"--data-dir ({where}); TensorFlow Federated publishes them in "
                         f"{URL}{archive} (unpack it into that directory; fljax never downloads)")
    return files


def shakespeare_blocks(snippet: str) -> tuple[np.ndarray, np.ndarray]:
    """(x [B, 80], y [B, 80]) of one snippet: blocks of 81 characters (module docstring)."""
    ids = _characters([snippet], "a Shakespeare snippet")[0]
    block = SEQUENCE_LENGTH + 1
    count = sum(1 for start in range(0, len(ids), block) if len(ids) - start > 1)
    x = np.full((count, SEQUENCE_LENGTH), LETTERS.index(" "), np.int32)
    y = np.full((count, SEQUENCE_LENGTH), -1, np.int32)
    for b in range(count):
        chunk = ids[b * block:(b + 1) * block]
        x[b, :len(chunk) - 1] = chunk[:-1]
        y[b, :len(chunk) - 1] = chunk[1:]
    return x, y


def _read(path: str, name: str) -> dict[str, dict[str, np.ndarray]]:
    """{client id: {key: array}} of one TFF HDF5 file."""
    import h5py   # imported here: only these datasets need it

    try:
        with h5py.File(path, "r") as f:
            if "examples" not in f or not isinstance(f["examples"], h5py.Group):
                raise FljaxError(f"{path!r} is not a TFF dataset file: it has no 'examples' "
                                 f"group (it has {sorted(f)[:5]})")
            return {client: {key: data[()] for key, data in group.items()}
                    for client, group in sorted(f["examples"].items())}
    except OSError as err:
        raise FljaxError(f"cannot read {path!r} as HDF5 ({str(err).strip().splitlines()[0]})"
                         ) from None


def _arrays(name: str, clients: dict, path: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{client id: (x, y)} in fljax's arrays."""
    key, label = TFF_DATASETS[name][2:4]
    out = {}
    for client, data in clients.items():
        needed = [k for k in (key, label) if k is not None]
        if any(k not in data for k in needed):
            raise FljaxError(f"client {client!r} in {path!r} lacks {needed}: it has "
                             f"{sorted(data)}")
        if key == "snippets":
            blocks = [shakespeare_blocks(s.decode("utf-8", "replace") if isinstance(s, bytes)
                                         else str(s)) for s in np.asarray(data[key]).ravel()]
            x = np.concatenate([b[0] for b in blocks] or [np.zeros((0, SEQUENCE_LENGTH), np.int32)])
            y = np.concatenate([b[1] for b in blocks] or [np.zeros((0, SEQUENCE_LENGTH), np.int32)])
        else:
            x, y = np.asarray(data[key]), np.asarray(data[label]).reshape(-1)
            shape = (28, 28) if key == "pixels" else (32, 32, 3)
            if x.shape[1:] != shape or len(x) != len(y):
                raise FljaxError(f"client {client!r} in {path!r}: {key} must be [n, "
                                 f"{', '.join(map(str, shape))}] and {label} [n], got {x.shape} "
                                 f"and {y.shape}")
            x = (x.astype(np.float32) / np.float32(255.0) if x.dtype == np.uint8
                 else x.astype(np.float32))
            if key == "pixels":
                x = x[..., None]
            y = y.astype(np.int32)
        out[client] = (x, y)
    return out


def load_tff(name: str, data_dir) -> Dataset:
    """TFF dataset ``name`` (``TFF_DATASETS``) from its two HDF5 files in ``data_dir``, with its
    clients as users (module docstring)."""
    if name not in TFF_DATASETS:
        raise FljaxError(f"unknown TFF dataset {name!r}; choose one of {sorted(TFF_DATASETS)}")
    train_path, test_path = tff_files(name, data_dir)
    train = {c: a for c, a in _arrays(name, _read(train_path, name), train_path).items()
             if len(a[1])}
    test = _arrays(name, _read(test_path, name), test_path)
    if not train:
        raise FljaxError(f"{train_path!r} has no training examples")
    ids = {client: i for i, client in enumerate(sorted(train))}
    same_users = TFF_DATASETS[name][5]
    kept = [c for c in sorted(test) if (c in ids or not same_users) and len(test[c][1])]
    if not kept:
        raise FljaxError(f"{test_path!r} has no test examples of training clients")
    stack = lambda parts, i: np.concatenate([p[i] for p in parts])
    x_train, y_train = stack([train[c] for c in ids], 0), stack([train[c] for c in ids], 1)
    x_test, y_test = stack([test[c] for c in kept], 0), stack([test[c] for c in kept], 1)
    user_train = np.repeat(np.arange(len(ids), dtype=np.int32), [len(train[c][1]) for c in ids])
    user_test = (np.repeat(np.asarray([ids[c] for c in kept], np.int32),
                           [len(test[c][1]) for c in kept]) if same_users else None)
    num_classes = TFF_DATASETS[name][4]
    low = -1 if name == "tff_shakespeare" else 0          # -1: a padded position
    for split, y in (("train", y_train), ("test", y_test)):
        if y.size and (y.min() < low or y.max() >= num_classes):
            raise FljaxError(f"dataset {name!r}: {split} labels must lie in [0, {num_classes}), "
                             f"got [{y.min()}, {y.max()}]")
    return Dataset(name, x_train, y_train, x_test, y_test, num_classes, user_train, user_test)
