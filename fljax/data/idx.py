"""IDX files, the format MNIST, Fashion-MNIST and EMNIST ship in (LeCun et al., "Gradient-based
learning applied to document recognition", Proceedings of the IEEE, 1998).

An IDX file (optionally gzipped) is, all integers big-endian:

- the magic number, 4 bytes: ``0x00 0x00``, a dtype code, the number of dimensions ``d``;
  dtype codes ``0x08`` uint8, ``0x09`` int8, ``0x0B`` int16, ``0x0C`` int32, ``0x0D`` float32,
  ``0x0E`` float64;
- ``d`` sizes, each an unsigned 32-bit integer;
- the data, ``prod(sizes)`` values of that dtype in C (row-major) order.

Datasets (``load_idx_dataset``), from a directory holding the four files:

- ``mnist``, ``fashion_mnist``: ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
  ``t10k-images-idx3-ubyte``, ``t10k-labels-idx1-ubyte``, each plain or ``.gz``;
- ``emnist_SPLIT`` (balanced, byclass, bymerge, digits, letters, mnist): NIST's
  ``emnist-SPLIT-train-images-idx3-ubyte`` etc. NIST stores each EMNIST image transposed
  (column-major); it is transposed back so that the images read like MNIST's.

Images become float32 [N, 28, 28, 1] in [0, 1], labels int32; the number of classes is the
largest label + 1 (EMNIST letters' labels are 1..26, so 27 classes, class 0 unused).
"""

from __future__ import annotations

import gzip
import os
import re
import zlib

import numpy as np

from fljax.data.dataset import Dataset
from fljax.errors import FljaxError

DTYPES = {0x08: np.dtype("u1"), 0x09: np.dtype("i1"), 0x0B: np.dtype(">i2"),
          0x0C: np.dtype(">i4"), 0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}
CODES = {np.dtype(v).newbyteorder("="): k for k, v in DTYPES.items()}
EMNIST_SPLITS = ("balanced", "byclass", "bymerge", "digits", "letters", "mnist")
# where Debian's package dataset-fashion-mnist installs Fashion-MNIST: fashion_mnist's data
# directory when none is given
DEBIAN_FASHION_MNIST = "/usr/share/datasets/fashion-mnist"
_EMNIST = re.compile(r"emnist_([a-z]+)")


def parse_idx(data: bytes, where: str = "IDX data") -> np.ndarray:
    """The array an IDX file's bytes hold (native byte order); a bad header or a wrong length is
    a one-line FljaxError naming ``where``."""
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in DTYPES:
        raise FljaxError(f"{where} is not an IDX file: its magic number is "
                         f"{data[:4].hex() or 'missing'}, expected 0000 then a dtype code "
                         f"({', '.join(f'{c:02x}' for c in DTYPES)}) and the number of "
                         f"dimensions")
    dtype, ndim = DTYPES[data[2]], data[3]
    if len(data) < 4 + 4 * ndim:
        raise FljaxError(f"{where} is truncated: {len(data)} bytes, too few for its {ndim} sizes")
    shape = tuple(int(s) for s in np.frombuffer(data, ">u4", ndim, 4))
    size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    body = len(data) - 4 - 4 * ndim
    if body != size:
        raise FljaxError(f"{where} is {'truncated' if body < size else 'too long'}: shape "
                         f"{shape} of {dtype.name} needs {size} data bytes, it has {body}")
    return np.frombuffer(data, dtype, offset=4 + 4 * ndim).reshape(shape).astype(
        dtype.newbyteorder("="))


def read_idx(path: str) -> np.ndarray:
    """The array of an IDX file, gzipped (a ``.gz`` name) or not."""
    try:
        if path.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                data = f.read()
        else:
            with open(path, "rb") as f:
                data = f.read()
    except (OSError, EOFError, zlib.error) as err:
        raise FljaxError(f"cannot read IDX file {path!r}: {str(err).strip() or type(err).__name__}"
                         ) from None
    return parse_idx(data, f"IDX file {path!r}")


def write_idx(path: str, array: np.ndarray) -> None:
    """Write ``array`` as an IDX file (gzipped when ``path`` ends in .gz)."""
    array = np.asarray(array)
    code = CODES.get(array.dtype.newbyteorder("="))
    if code is None:
        raise FljaxError(f"IDX cannot hold dtype {array.dtype}; it holds "
                         f"{sorted(str(d) for d in CODES)}")
    data = (bytes([0, 0, code, array.ndim]) + np.asarray(array.shape, ">u4").tobytes()
            + np.ascontiguousarray(array, DTYPES[code]).tobytes())
    with (gzip.open(path, "wb") if path.endswith(".gz") else open(path, "wb")) as f:
        f.write(data)


def idx_names(name: str) -> dict[str, str] | None:
    """{'train images': file stem, ...} of dataset ``name``, None when it is no IDX dataset."""
    if name in ("mnist", "fashion_mnist"):
        prefix = ""
    elif _EMNIST.fullmatch(name) and name[7:] in EMNIST_SPLITS:
        prefix = f"emnist-{name[7:]}-"
    else:
        return None
    return {f"{split} {kind}": f"{prefix}{stem}-{kind}-idx{3 if kind == 'images' else 1}-ubyte"
            for split, stem in (("train", "train"), ("test", "t10k"))
            for kind in ("images", "labels")}


def find_idx(directory: str, stem: str) -> str | None:
    """The path of ``stem`` or ``stem.gz`` in ``directory`` (the plain file first), else None."""
    for path in (os.path.join(directory, stem), os.path.join(directory, stem + ".gz")):
        if os.path.isfile(path):
            return path
    return None


def has_idx(name: str, directory) -> bool:
    """Whether ``directory`` holds every IDX file of dataset ``name``."""
    stems = idx_names(name)
    return bool(stems and directory is not None and os.path.isdir(directory)
                and all(find_idx(os.fspath(directory), s) for s in stems.values()))


def load_idx_dataset(name: str, directory: str) -> Dataset:
    """Dataset ``name`` (mnist, fashion_mnist, emnist_SPLIT) from its IDX files in ``directory``."""
    stems = idx_names(name)
    if stems is None:
        raise FljaxError(f"{name!r} is no IDX dataset; they are mnist, fashion_mnist and "
                         f"emnist_SPLIT ({', '.join(EMNIST_SPLITS)})")
    directory = os.fspath(directory)
    arrays = {}
    for key, stem in stems.items():
        path = find_idx(directory, stem)
        if path is None:
            raise FljaxError(f"dataset {name!r}: no {stem} or {stem}.gz in {directory!r}")
        arrays[key] = read_idx(path)
    parts = []
    for split in ("train", "test"):
        x, y = arrays[f"{split} images"], arrays[f"{split} labels"]
        if x.ndim != 3 or y.ndim != 1 or len(x) != len(y):
            raise FljaxError(f"dataset {name!r}: {split} images must be [N, H, W] and labels [N], "
                             f"got {x.shape} and {y.shape}")
        if name.startswith("emnist_"):
            x = x.transpose(0, 2, 1)       # NIST stores EMNIST images column by column
        x = (x.astype(np.float32) / np.float32(255.0) if x.dtype == np.uint8
             else x.astype(np.float32))
        parts += [x[..., None], y.astype(np.int32)]
    x_train, y_train, x_test, y_test = parts
    if min(y_train.min(), y_test.min()) < 0:
        raise FljaxError(f"dataset {name!r} has negative labels")
    num_classes = int(max(y_train.max(), y_test.max())) + 1
    return Dataset(name, x_train, y_train, x_test, y_test, num_classes)
