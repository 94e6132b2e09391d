"""Reading tensorflow-datasets data prepared (array_record) in a local directory: opening a split
with every failure as a one-line FljaxError, reading a whole split into arrays, and the messages.

Shared by :mod:`fljax.data.loaders` (image datasets) and :mod:`fljax.data.text` (GLUE SST-2).
Nothing here imports tensorflow_datasets (slow to import): callers pass the module in.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from fljax.errors import FljaxError

READ_CHUNK = 1024   # records per read of a data source


def prepare_hint(name: str, data_dir: str, download: bool = True) -> str:
    """How to prepare dataset ``name`` in ``data_dir`` (fljax downloads only with --download;
    ``download``: whether to name it, for the datasets its tfds loader can prepare)."""
    return (
        f"prepare it once on a machine with internet: pip install tensorflow && "
        f"tfds build {name} --data_dir {data_dir} --file_format array_record"
        + ("; or pass --download to let fljax download and prepare it" if download else
           " (fljax never downloads it)")
    )


def first_line(err: BaseException) -> str:
    """The first line of an exception's message, or its type's name when it has none."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def open_split(tfds, name: str, split: str, data_dir: str):
    """``tfds.data_source`` for one split, with every failure turned into a one-line FljaxError."""
    try:
        return tfds.data_source(name, split=split, data_dir=data_dir, download=False, try_gcs=False)
    except tfds.core.DatasetNotFoundError:
        raise FljaxError(
            f"unknown dataset {name!r}: not a tensorflow-datasets name and not found in '{data_dir}' "
            "(names: https://www.tensorflow.org/datasets/catalog/overview, or 'digits')"
        ) from None
    except Exception as err:  # diagnose below: not prepared, wrong file format or bad split
        try:
            prepared = tfds.builder(name, data_dir=data_dir).is_prepared()
        except Exception:
            prepared = None
        if prepared is False:
            raise FljaxError(
                f"dataset {name!r} is not prepared in '{data_dir}'; {prepare_hint(name, data_dir)}"
            ) from err
        if prepared and isinstance(err, NotImplementedError):
            raise FljaxError(
                f"dataset {name!r} in '{data_dir}' is not in a random-access format (array_record); "
                f"rebuild it: tfds build {name} --data_dir {data_dir} --file_format array_record"
            ) from err
        raise FljaxError(
            f"cannot read split {split!r} of dataset {name!r} from '{data_dir}': {first_line(err)}"
        ) from err


def read_split(source, name: str, split: str, image_key: str, label_key: str):
    """Read a whole data source into (images, labels), in chunks of ``READ_CHUNK`` records."""
    images, labels = [], []
    batched = hasattr(source, "__getitems__")
    for start in range(0, len(source), READ_CHUNK):
        keys = list(range(start, min(start + READ_CHUNK, len(source))))
        records: Sequence[dict] | None = None
        if batched:
            try:
                records = source.__getitems__(keys)
            except TypeError:  # e.g. tfds.testing.mock_data's __getitems__ in tfds 4.9.10
                batched = False
        if records is None:
            records = [source[k] for k in keys]
        if records and (image_key not in records[0] or label_key not in records[0]):
            raise FljaxError(
                f"dataset {name!r} split {split!r} has no {image_key!r}/{label_key!r} features, "
                f"only {sorted(records[0])}; pass image_key= and label_key="
            )
        images.append(np.stack([np.asarray(r[image_key]) for r in records]))
        labels.append(np.asarray([r[label_key] for r in records]))
    if not images:
        raise FljaxError(f"split {split!r} of dataset {name!r} is empty")
    return np.concatenate(images), np.concatenate(labels)
