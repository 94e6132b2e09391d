"""Tiny-ImageNet from its standard folder, decoded once and cached as arrays.

The folder is the unpacked ``tiny-imagenet-200`` archive (fljax never downloads it):

    DIR/wnids.txt                      the 200 class ids (WordNet ids), one per line
    DIR/train/<wnid>/images/*.JPEG     500 64x64 training images per class
    DIR/val/images/*.JPEG              10,000 labelled held-out images
    DIR/val/val_annotations.txt        file name <TAB> wnid <TAB> bounding box (ignored)

The labelled ``val`` split is the test split (the archive's ``test`` images have no labels), as
the papers that report Tiny-ImageNet accuracy use it. A class's label is its line in wnids.txt.
Images are decoded with Pillow (the few grayscale ones as RGB). The first read writes the uint8
arrays to ``DIR/fljax_arrays.npz`` (atomically; skipped where the folder is read-only), and later
reads load that file.
"""

from __future__ import annotations

import os

import numpy as np

from fljax.data.dataset import Dataset
from fljax.errors import FljaxError

SIZE = (64, 64, 3)
CACHE = "fljax_arrays.npz"
ARRAYS = ("x_train", "y_train", "x_test", "y_test")


def load_tiny_imagenet(directory) -> Dataset:
    """The dataset in ``directory`` (see the module doc): images float32 in [0, 1], 200 classes
    (the number of lines of wnids.txt)."""
    if directory is None:
        raise FljaxError("dataset 'tiny_imagenet' needs data_dir, the unpacked tiny-imagenet-200 "
                         "folder (fljax never downloads)")
    directory = os.path.expanduser(os.fspath(directory))
    cache = os.path.join(directory, CACHE)
    if os.path.isfile(cache):
        with np.load(cache, allow_pickle=False) as f:
            arrays = {k: f[k] for k in ARRAYS}
    else:
        arrays = read_folder(directory)
        write_cache(cache, arrays)
    x_train, y_train, x_test, y_test = (arrays[k] for k in ARRAYS)
    return Dataset("tiny_imagenet", x_train.astype(np.float32) / np.float32(255.0),
                   y_train.astype(np.int32), x_test.astype(np.float32) / np.float32(255.0),
                   y_test.astype(np.int32), int(y_train.max()) + 1)


def read_folder(directory: str) -> dict[str, np.ndarray]:
    """The uint8 images and int32 labels of both splits, files in sorted order."""
    wnids_file = os.path.join(directory, "wnids.txt")
    if not os.path.isfile(wnids_file):
        raise FljaxError(f"{directory!r} is not a tiny-imagenet-200 folder: it has no wnids.txt "
                         f"(unpack the archive and pass its folder as data_dir)")
    with open(wnids_file) as f:
        wnids = [line.strip() for line in f if line.strip()]
    label = {wnid: i for i, wnid in enumerate(wnids)}
    train = []
    for wnid in wnids:
        images = os.path.join(directory, "train", wnid, "images")
        if not os.path.isdir(images):
            raise FljaxError(f"tiny-imagenet folder {directory!r} lacks {images!r} (class "
                             f"{wnid!r} of wnids.txt)")
        train += [(os.path.join(images, name), label[wnid]) for name in sorted(os.listdir(images))]
    annotations = os.path.join(directory, "val", "val_annotations.txt")
    if not os.path.isfile(annotations):
        raise FljaxError(f"tiny-imagenet folder {directory!r} lacks {annotations!r}")
    test = []
    with open(annotations) as f:
        for number, line in enumerate(f, 1):
            fields = line.split("\t")
            if len(fields) < 2 or fields[1] not in label:
                raise FljaxError(f"{annotations!r} line {number}: expected 'file<TAB>wnid' with "
                                 f"a wnid of wnids.txt, got {line.strip()!r}")
            test.append((os.path.join(directory, "val", "images", fields[0]), label[fields[1]]))
    x_train, y_train = decode(sorted(train))
    x_test, y_test = decode(sorted(test))
    return dict(x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)


def decode(files: list[tuple[str, int]]) -> tuple[np.ndarray, np.ndarray]:
    """uint8 [N, 64, 64, 3] images and int32 labels of (path, label) pairs."""
    from PIL import Image, UnidentifiedImageError

    if not files:
        raise FljaxError("tiny-imagenet split has no images")
    x = np.empty((len(files), *SIZE), np.uint8)
    for i, (path, _) in enumerate(files):
        try:
            with Image.open(path) as image:
                x[i] = np.asarray(image.convert("RGB"))
        except (OSError, UnidentifiedImageError, ValueError) as e:
            shape = f" ({e})" if not isinstance(e, ValueError) else f" (not {SIZE[0]}x{SIZE[1]})"
            raise FljaxError(f"tiny-imagenet image {path!r} cannot be read{shape}") from None
    return x, np.array([y for _, y in files], np.int32)


def write_cache(path: str, arrays: dict[str, np.ndarray]) -> None:
    """Write the arrays to ``path`` through a temporary file; a read-only folder skips it."""
    temporary = f"{path}.tmp-{os.getpid()}.npz"
    try:
        np.savez(temporary, **arrays)
        os.replace(temporary, path)
    except OSError:
        if os.path.exists(temporary):
            os.remove(temporary)
