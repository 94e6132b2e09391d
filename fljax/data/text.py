"""Text classification data: GLUE SST-2 through tensorflow-datasets from a local directory, turned
into int32 token ids by BERT's WordPiece (with a local ``vocab.txt``) or a word vocabulary.

SST-2's GLUE test split has no labels (-1), so, as FederatedScope's and most FL benchmarks' SST2
does, fljax trains on the train split (67,349 sentences) and tests on the validation split (872).
"""

from __future__ import annotations

import collections
import glob
import os
import re
import unicodedata

import numpy as np

from fljax.data.dataset import Dataset
from fljax.data.tfds_files import first_line, prepare_hint, read_split
from fljax.errors import FljaxError

MAX_LENGTH = 64           # tokens per sentence, [CLS] and [SEP] included
PAD, UNK, CLS, SEP = "[PAD]", "[UNK]", "[CLS]", "[SEP]"


def basic_tokens(text: str) -> list[str]:
    """BERT's basic tokenizer (uncased): lowercase, strip accents, split on whitespace and
    around every punctuation character."""
    text = unicodedata.normalize("NFD", text.lower())
    text = "".join(c for c in text if unicodedata.category(c) != "Mn")
    spaced = "".join(f" {c} " if unicodedata.category(c).startswith("P") or c in "$+<=>^`|~"
                     else c for c in text)
    return spaced.split()


class WordPiece:
    """BERT's WordPiece over a vocabulary (a local ``vocab.txt``, one token per line, the id its
    line number): each basic token is cut greedily into the longest pieces in the vocabulary,
    continuations prefixed '##'; a word with no cut, or longer than 100 characters, is [UNK]."""

    def __init__(self, vocabulary: dict[str, int]):
        missing = [t for t in (PAD, UNK, CLS, SEP) if t not in vocabulary]
        if missing:
            raise FljaxError(f"the vocabulary lacks BERT's special tokens {missing}")
        self.vocabulary = vocabulary

    @classmethod
    def from_file(cls, path: str) -> "WordPiece":
        if not os.path.isfile(path):
            raise FljaxError(f"vocabulary file {path!r} does not exist")
        with open(path, encoding="utf-8") as f:
            return cls({line.rstrip("\n"): i for i, line in enumerate(f)})

    def pieces(self, word: str) -> list[str]:
        if len(word) > 100:
            return [UNK]
        pieces, start = [], 0
        while start < len(word):
            end = len(word)
            while end > start:
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in self.vocabulary:
                    break
                end -= 1
            if end == start:
                return [UNK]
            pieces.append(piece)
            start = end
        return pieces

    def encode(self, texts: list[str], max_length: int = MAX_LENGTH) -> np.ndarray:
        """int32 [N, max_length]: [CLS] pieces [SEP], cut to fit, padded with [PAD]."""
        ids = np.full((len(texts), max_length), self.vocabulary[PAD], np.int32)
        for i, text in enumerate(texts):
            pieces = [p for w in basic_tokens(text) for p in self.pieces(w)][:max_length - 2]
            row = [self.vocabulary[t] for t in [CLS, *pieces, SEP]]
            ids[i, :len(row)] = row
        return ids


def word_vocabulary(texts: list[str], size: int = 30000) -> dict[str, int]:
    """Without a BERT vocabulary: [PAD] 0, [UNK] 1, [CLS] 2, [SEP] 3, then the ``size`` most
    frequent basic tokens of ``texts`` (the training sentences), each a single piece."""
    counts = collections.Counter(w for t in texts for w in basic_tokens(t))
    special = {PAD: 0, UNK: 1, CLS: 2, SEP: 3}
    return {**special, **{w: i + 4 for i, (w, _) in enumerate(counts.most_common(size))}}


def prepared_split(data_dir: str, name: str, split: str):
    """A split of tfds dataset ``name`` prepared (array_record) under ``data_dir/name/VERSION``,
    read through its ``dataset_info.json`` alone: GLUE's builder code needs tensorflow, which
    fljax does not install."""
    import tensorflow_datasets as tfds  # slow to import: only when SST-2 is read

    infos = glob.glob(os.path.join(data_dir, name, "*", "dataset_info.json"))
    if not infos:
        raise FljaxError(f"dataset {name!r} is not prepared in {data_dir!r} (no {name}/VERSION/"
                         f"dataset_info.json); {prepare_hint(name, data_dir, download=False)}")
    newest = max(infos, key=lambda p: tuple(int(v) for v in re.findall(r"\d+", os.path.basename(
        os.path.dirname(p)))))
    try:
        return tfds.builder_from_directory(os.path.dirname(newest)).as_data_source(split=split)
    except Exception as err:       # a missing split, a wrong file format: say which
        raise FljaxError(f"cannot read split {split!r} of {name!r} in "
                         f"{os.path.dirname(newest)!r}: {first_line(err)}") from None


def load_sst2(data_dir: str, *, vocab_path: str | None = None,
              max_length: int = MAX_LENGTH) -> Dataset:
    """SST-2 (``glue/sst2``, prepared in ``data_dir`` as array_record) as token ids: x int32
    [N, max_length], y int32 [N] (0 negative, 1 positive). WordPiece with ``vocab_path`` (BERT's
    vocab.txt, e.g. next to the pretrained weights); without it, ``data_dir/vocab.txt`` if there,
    else a word vocabulary of the training sentences (no pretrained embeddings then)."""
    name = "glue/sst2"
    if data_dir is None or not os.path.isdir(os.path.expanduser(str(data_dir))):
        raise FljaxError(f"dataset {name!r} needs --data-dir with glue/sst2 prepared by tfds; "
                         f"got {data_dir!r}")
    data_dir = os.path.expanduser(str(data_dir))
    text = {}
    for split in ("train", "validation"):
        sentences, labels = read_split(prepared_split(data_dir, "glue/sst2", split), name,
                                       split, "sentence", "label")
        text[split] = ([s.decode("utf-8") if isinstance(s, bytes) else str(s)
                        for s in sentences], labels.astype(np.int32))
    if vocab_path is None and os.path.isfile(os.path.join(data_dir, "vocab.txt")):
        vocab_path = os.path.join(data_dir, "vocab.txt")
    tokenizer = WordPiece.from_file(vocab_path) if vocab_path else WordPiece(
        word_vocabulary(text["train"][0]))
    (train, y_train), (test, y_test) = text["train"], text["validation"]
    return Dataset(name, tokenizer.encode(train, max_length), y_train,
                   tokenizer.encode(test, max_length), y_test, 2)
