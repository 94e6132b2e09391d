"""Tiny-ImageNet from a tiny-imagenet-200 folder the test writes: labels from wnids.txt, the val
split as the test split, grayscale images as RGB, the array cache, one-line errors; tiny_cnn."""

import os

import numpy as np
import pytest
from PIL import Image

from fljax import FljaxError
from fljax.runner.cli import main
from fljax.data import loaders
from fljax.data.tiny_imagenet import CACHE, load_tiny_imagenet

WNIDS = ["n02", "n01", "n03"]             # not sorted: a label is the line in wnids.txt


def write_folder(root, per_class=2, gray=("n01", 1)):
    """A tiny-imagenet-200 layout; image k of class c is filled with value 10 * label + k."""
    os.makedirs(root)
    (root / "wnids.txt").write_text("\n".join(WNIDS) + "\n")
    for label, wnid in enumerate(WNIDS):
        images = root / "train" / wnid / "images"
        os.makedirs(images)
        for k in range(per_class):
            value = 10 * label + k
            if (wnid, k) == gray:
                Image.fromarray(np.full((64, 64), value, np.uint8), "L").save(
                    images / f"{wnid}_{k}.JPEG", quality=100)
            else:
                Image.fromarray(np.full((64, 64, 3), value, np.uint8)).save(
                    images / f"{wnid}_{k}.JPEG", quality=100)
    os.makedirs(root / "val" / "images")
    lines = []
    for i, wnid in enumerate(["n03", "n02"]):
        Image.fromarray(np.full((64, 64, 3), 100 + i, np.uint8)).save(
            root / "val" / "images" / f"val_{i}.JPEG", quality=100)
        lines.append(f"val_{i}.JPEG\t{wnid}\t0\t0\t63\t63")
    (root / "val" / "val_annotations.txt").write_text("\n".join(lines) + "\n")


def test_the_folder_reads_with_wnid_labels_and_val_as_test(tmp_path):
    root = tmp_path / "tiny-imagenet-200"
    write_folder(root)
    ds = load_tiny_imagenet(root)
    assert ds.num_classes == 3 and ds.x_train.shape == (6, 64, 64, 3)
    assert ds.x_train.dtype == np.float32 and ds.y_train.dtype == np.int32
    values = np.rint(ds.x_train[:, 0, 0] * 255).astype(int)            # JPEG of a flat image
    assert np.all(values == values[:, :1])                               # gray -> 3 equal channels
    np.testing.assert_array_equal(values[:, 0], 10 * ds.y_train + np.tile([0, 1], 3))
    np.testing.assert_array_equal(sorted(ds.y_train), [0, 0, 1, 1, 2, 2])
    np.testing.assert_array_equal(ds.y_test, [2, 0])                     # val_0 n03, val_1 n02
    np.testing.assert_array_equal(np.rint(ds.x_test[:, 0, 0, 0] * 255), [100, 101])
    # the cache: a second read needs no image files
    assert (root / CACHE).is_file()
    for path in (root / "train").rglob("*.JPEG"):
        path.unlink()
    again = load_tiny_imagenet(root)
    np.testing.assert_array_equal(again.x_train, ds.x_train)
    standardized = loaders.load_dataset("tiny_imagenet", data_dir=str(root))
    mean, std = loaders.CHANNEL_STATS["tiny_imagenet"]
    np.testing.assert_allclose(standardized.x_test, (ds.x_test - np.array(mean)) / np.array(std),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("damage, message", [
    (lambda root: (root / "wnids.txt").unlink(), "is not a tiny-imagenet-200 folder: it has no "
                                                 "wnids.txt"),
    (lambda root: (root / "wnids.txt").write_text("n02\nn09\n"), "lacks"),
    (lambda root: (root / "val" / "val_annotations.txt").write_text("val_0.JPEG\tn77\n"),
     "line 1: expected 'file<TAB>wnid' with a wnid of wnids.txt"),
    (lambda root: Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(
        root / "val" / "images" / "val_0.JPEG"), "cannot be read (not 64x64)"),
])
def test_a_malformed_folder_is_one_line(tmp_path, damage, message):
    root = tmp_path / "tiny-imagenet-200"
    write_folder(root)
    damage(root)
    with pytest.raises(FljaxError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_tiny_imagenet(root)


def test_tiny_cnn_trains_on_it_with_flips_and_a_missing_folder_exits_2(tmp_path, capsys):
    root = tmp_path / "tiny-imagenet-200"
    write_folder(root, per_class=4)
    flags = ["--dataset", "tiny_imagenet", "--model", "tiny_cnn", "--augment", "flip",
             "--partition", "iid", "--num-clients", "3", "--clients-per-round", "3",
             "--batch-size", "2",
             "--rounds", "1", "--quiet"]
    assert main([*flags, "--data-dir", str(root), "--out-dir", str(tmp_path / "r")]) == 0
    assert "final accuracy" in capsys.readouterr().out
    assert main([*flags, "--data-dir", str(tmp_path / "none"), "--out-dir",
                 str(tmp_path / "r2")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a tiny-imagenet-200 folder" in err
