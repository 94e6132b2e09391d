"""SST-2 as token ids: BERT's WordPiece on hand examples, and glue/sst2 read from a prepared local
tfds directory (built here without tensorflow), with its bad input."""

import os
import shutil

import numpy as np
import pytest
import tensorflow_datasets as tfds

from fljax.data.loaders import load_dataset
from fljax.data.text import WordPiece, basic_tokens, load_sst2, word_vocabulary
from fljax.errors import FljaxError

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "the", "film", "un", "##want", "##ed", "good", ",",
         "!", "cafe"]


class Sst2Like(tfds.core.GeneratorBasedBuilder):
    """glue/sst2's features (sentence text, 2-class label) and splits, tiny."""

    VERSION = tfds.core.Version("2.0.0")

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
            "sentence": tfds.features.Text(), "label": tfds.features.ClassLabel(num_classes=2)}))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(["The film , unwanted !", "good good film"]),
                "validation": self._generate_examples(["Café good"])}

    def _generate_examples(self, texts):
        for i, text in enumerate(texts):
            yield i, {"sentence": text, "label": i % 2}


def test_wordpiece_is_berts_greedy_longest_match(tmp_path):
    (tmp_path / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    tokenizer = WordPiece.from_file(str(tmp_path / "vocab.txt"))
    assert basic_tokens("The Café, unwanted!") == ["the", "cafe", ",", "unwanted", "!"]
    assert tokenizer.pieces("unwanted") == ["un", "##want", "##ed"]
    assert tokenizer.pieces("wanted") == ["[UNK]"]
    ids = tokenizer.encode(["The Café, unwanted!", "good " * 10], max_length=8)
    assert ids[0].tolist() == [2, 4, 12, 10, 6, 7, 8, 3]          # cut to fit, [SEP] kept
    assert ids[1].tolist() == [2, 9, 9, 9, 9, 9, 9, 3]


def prepare(tmp_path):
    Sst2Like(data_dir=str(tmp_path / "build"), file_format="array_record").download_and_prepare()
    target = tmp_path / "data" / "glue" / "sst2"
    target.parent.mkdir(parents=True)
    shutil.move(str(tmp_path / "build" / "sst2_like"), str(target))
    return str(tmp_path / "data")


def test_sst2_reads_prepared_tfds_data_as_tokens(tmp_path):
    data_dir = prepare(tmp_path)
    ds = load_dataset("glue/sst2", data_dir=data_dir)
    vocabulary = word_vocabulary(["The film , unwanted !", "good good film"])
    assert ds.num_classes == 2 and ds.x_train.shape == (2, 64) and ds.x_train.dtype == np.int32
    assert ds.x_train[1, :5].tolist() == [2, vocabulary["good"], vocabulary["good"],
                                          vocabulary["film"], 3]
    assert ds.x_test[0, :4].tolist() == [2, 1, vocabulary["good"], 3]     # 'cafe' unseen
    assert ds.y_train.tolist() == [0, 1] and ds.y_test.tolist() == [0]
    (tmp_path / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    bert = load_sst2(data_dir, vocab_path=str(tmp_path / "vocab.txt"), max_length=6)
    assert bert.x_train[0].tolist() == [2, 4, 5, 10, 6, 3]


@pytest.mark.parametrize("case", ["no_dir", "not_prepared", "no_vocab"])
def test_bad_sst2_input_is_one_line(tmp_path, case):
    data_dir = {"no_dir": str(tmp_path / "missing"), "not_prepared": str(tmp_path)}.get(case)
    if case == "no_vocab":
        data_dir = prepare(tmp_path)
    with pytest.raises(FljaxError) as err:
        load_sst2(data_dir, vocab_path=str(tmp_path / "nope.txt") if case == "no_vocab" else None)
    expected = {"no_dir": "needs --data-dir", "not_prepared": "is not prepared in",
                "no_vocab": "nope.txt' does not exist"}[case]
    assert expected in str(err.value) and "\n" not in str(err.value)
