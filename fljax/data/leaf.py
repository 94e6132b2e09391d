"""LEAF-format federated datasets read from a local directory: clients are the dataset's own users.

LEAF (Caldas et al. 2018, github TalwalkarLab/leaf) stores a dataset as JSON files, each holding
some users::

    {"users": [name, ...], "num_samples": [n, ...], "user_data": {name: {"x": [...], "y": [...]}}}

under ``data/train`` and ``data/test`` (LEAF's own split, per user or per group of users) or
``data/all_data`` (not split yet). ``load_leaf`` reads either; with ``all_data`` every user's
examples are split by fljax, a seeded ``test_fraction`` of each user's examples (at least one
example stays in training). Users are numbered 0..U-1 in sorted name order, over the users that
have training examples; a user found only in the test files is dropped (it could not train).

Kinds (how ``x`` and ``y`` become arrays):

- ``femnist``: 784 floats per image -> float32 [N, 28, 28, 1], kept as LEAF stores them (1.0 is
  the white background, ink is dark); 62 classes.
- ``shakespeare``: 80-character strings -> int32 [N, 80], indices in LEAF's 80-letter alphabet
  (``LETTERS``, ``language_utils.ALL_LETTERS``); a character outside it (LEAF's ``find`` gives -1)
  becomes the space. fljax trains next-character prediction at EVERY position: y [N, 80] with
  y[:, t] = x[:, t + 1] for t < 79 and y[:, 79] = LEAF's target, the next character.
- ``sent140``: the tweet record (text at index 4, as LEAF's sent140 model reads it) -> int32
  [N, 25] word ids (LEAF's 25 words): lowercase words and punctuation, a vocabulary of the
  training users' ``vocabulary_size`` most frequent words (0 pad, 1 unknown); 2 classes.
- ``synthetic``: float vectors -> float32 [N, D]; classes = the largest label + 1.
"""

from __future__ import annotations

import collections
import glob
import json
import os
import re

import numpy as np

from fljax.data.dataset import Dataset
from fljax.data.synthetic import generate
from fljax.errors import FljaxError

KINDS = ("femnist", "shakespeare", "sent140", "synthetic")
LETTERS = ("\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}")
SEQUENCE_LENGTH = 80      # Shakespeare's characters per example
TWEET_WORDS = 25          # Sent140's words per example
_WORD = re.compile(r"[\w']+|[.,!?;]")


def find_splits(directory: str) -> dict[str, str]:
    """{'train': dir, 'test': dir} or {'all_data': dir} under a LEAF dataset root, its ``data``
    folder, or the folder holding the splits."""
    directory = os.path.expanduser(os.fspath(directory))
    if not os.path.isdir(directory):
        raise FljaxError(f"LEAF directory {directory!r} does not exist")
    for base in (directory, os.path.join(directory, "data")):
        train, test = os.path.join(base, "train"), os.path.join(base, "test")
        if os.path.isdir(train) and os.path.isdir(test):
            return {"train": train, "test": test}
        if os.path.isdir(os.path.join(base, "all_data")):
            return {"all_data": os.path.join(base, "all_data")}
    raise FljaxError(f"LEAF directory {directory!r} has neither train/ and test/ nor all_data/ "
                     f"(in it or in its data/ folder)")


def read_users(folder: str) -> dict[str, tuple[list, list]]:
    """{user: (x list, y list)} from every .json file of a LEAF split folder, checked."""
    files = sorted(glob.glob(os.path.join(folder, "*.json")))
    if not files:
        raise FljaxError(f"LEAF folder {folder!r} has no .json files")
    users: dict[str, tuple[list, list]] = {}
    for path in files:
        try:
            with open(path) as f:
                content = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise FljaxError(f"LEAF file {path!r} is not valid JSON") from None
        if not isinstance(content, dict) or not {"users", "user_data"} <= set(content):
            raise FljaxError(f"LEAF file {path!r} must be a JSON object with 'users' and "
                             f"'user_data'")
        counts = content.get("num_samples", [None] * len(content["users"]))
        for name, count in zip(content["users"], counts):
            record = content["user_data"].get(name)
            if not isinstance(record, dict) or "x" not in record or "y" not in record:
                raise FljaxError(f"LEAF file {path!r}: user {name!r} has no 'x' and 'y' in "
                                 f"user_data")
            x, y = record["x"], record["y"]
            if len(x) != len(y) or (count is not None and count != len(y)):
                raise FljaxError(f"LEAF file {path!r}: user {name!r} has {len(x)} x, {len(y)} y "
                                 f"and num_samples {count}; they must agree")
            old_x, old_y = users.get(str(name), ([], []))
            users[str(name)] = (old_x + list(x), old_y + list(y))
    return users


def _characters(texts: list, where: str) -> np.ndarray:
    """int32 [N, length] indices in LETTERS (outside it: the space), without a loop over
    characters: the texts are joined and read as UTF-32 code points."""
    lengths = {len(t) for t in texts}
    if len(lengths) != 1:
        raise FljaxError(f"shakespeare examples in {where!r} must all have one length "
                         f"({SEQUENCE_LENGTH} in LEAF), got lengths {sorted(lengths)[:5]}")
    table = np.full(256, LETTERS.index(" "), np.int32)
    table[[ord(c) for c in LETTERS]] = np.arange(len(LETTERS))
    codes = np.frombuffer("".join(texts).encode("utf-32-le"), np.uint32)
    index = np.where(codes < 256, table[np.minimum(codes, 255)], LETTERS.index(" "))
    return index.reshape(len(texts), lengths.pop()).astype(np.int32)


def _encode(kind: str, x: list, y: list, where: str, vocabulary: dict | None):
    """(x array, y array) of one kind."""
    try:
        if kind == "femnist":
            images = np.asarray(x, np.float32)
            if images.ndim != 2 or images.shape[1] != 784:
                raise FljaxError(f"femnist examples in {where!r} must be 784 pixel values, got "
                                 f"shape {images.shape[1:]}")
            return images.reshape(-1, 28, 28, 1), np.asarray(y, np.int32)
        if kind == "synthetic":
            vectors = np.asarray(x, np.float32)
            if vectors.ndim != 2:
                raise FljaxError(f"synthetic examples in {where!r} must be vectors of one "
                                 f"length, got shape {vectors.shape}")
            return vectors, np.asarray(y, np.int32)
        if kind == "shakespeare":
            if not all(isinstance(t, str) for t in x) or not all(
                    isinstance(t, str) and len(t) == 1 for t in y):
                raise FljaxError(f"shakespeare examples in {where!r} must be strings and their "
                                 f"targets single characters")
            tokens = _characters(x, where)
            targets = np.concatenate([tokens[:, 1:], _characters(y, where)], axis=1)
            return tokens, targets
        words = [_WORD.findall(str(record[4]).lower()) if isinstance(record, list) and
                 len(record) > 4 else None for record in x]
        if any(w is None for w in words):
            raise FljaxError(f"sent140 examples in {where!r} must be LEAF tweet records (lists "
                             f"with the text at index 4)")
        ids = np.zeros((len(words), TWEET_WORDS), np.int32)
        for i, sentence in enumerate(words):
            row = [vocabulary.get(w, 1) for w in sentence[:TWEET_WORDS]]
            ids[i, :len(row)] = row
        return ids, np.asarray(y, np.int32)
    except (TypeError, ValueError) as err:
        raise FljaxError(f"{kind} examples in {where!r} have the wrong format ({err})") from None


def word_vocabulary(users: dict, size: int) -> dict[str, int]:
    """The ``size`` most frequent lowercase words of the users' tweets: word -> id (from 2)."""
    counts = collections.Counter(w for x, _ in users.values() for record in x
                                 if isinstance(record, list) and len(record) > 4
                                 for w in _WORD.findall(str(record[4]).lower()))
    return {w: i + 2 for i, (w, _) in enumerate(counts.most_common(size))}


def _user_split(users: dict, fraction: float, seed: int) -> tuple[dict, dict]:
    """fljax's per-user split of LEAF's all_data: round(fraction * n) test examples per user,
    at least one left for training."""
    if not 0.0 < fraction < 1.0:
        raise FljaxError(f"test_fraction must be in (0, 1), got {fraction!r}")
    rng = np.random.default_rng(seed)
    train, test = {}, {}
    for name in sorted(users):
        x, y = users[name]
        order = rng.permutation(len(y))
        held = min(int(round(fraction * len(y))), len(y) - 1)
        train[name] = ([x[i] for i in order[held:]], [y[i] for i in order[held:]])
        if held:
            test[name] = ([x[i] for i in order[:held]], [y[i] for i in order[:held]])
    return train, test


def sample_users(users: dict, count: int, seed: int = 0) -> dict:
    """``count`` of ``users`` ({name: data}), a seeded draw without replacement (0: all), as
    FederatedScope's pFL-Bench takes its FEMNIST clients from LEAF's writers (200 writers,
    ``data.subsample`` 0.05 of LEAF's files, ``federate.client_num`` 200)."""
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise FljaxError(f"sample_users must be an integer >= 0 (0: every user), got {count!r}")
    if count == 0:
        return users
    names = sorted(users)
    if count > len(names):
        raise FljaxError(f"sample_users={count} asks for more users than the LEAF data holds "
                         f"({len(names)}); prepare more of the dataset (a larger LEAF --sf)")
    chosen = np.random.default_rng([seed, 0x75736572]).choice(len(names), count, replace=False)
    return {names[i]: users[names[i]] for i in sorted(chosen)}


def load_leaf(directory: str, kind: str | None = None, *, test_fraction: float = 0.1,
              seed: int = 0, vocabulary_size: int = 10000, users: int = 0) -> Dataset:
    """A LEAF dataset with its users (``user_train``/``user_test``), from a local directory;
    ``users`` > 0 keeps that many of its users (``sample_users``, drawn with ``seed``)."""
    splits = find_splits(directory)
    if kind is None:
        found = [k for k in KINDS if k in os.path.abspath(os.path.expanduser(directory))]
        kind = found[-1] if found else None
    if kind not in KINDS:
        raise FljaxError(f"LEAF kind must be one of {KINDS} (or a directory named after one), "
                         f"got {kind!r}")
    if "all_data" in splits:
        train, test = _user_split(read_users(splits["all_data"]), test_fraction, seed)
    else:
        train, test = read_users(splits["train"]), read_users(splits["test"])
    train = sample_users({name: data for name, data in train.items() if len(data[1])}, users,
                         seed)
    if not train:
        raise FljaxError(f"LEAF directory {directory!r} has no training examples")
    names = sorted(train)
    ids = {name: i for i, name in enumerate(names)}
    vocabulary = word_vocabulary(train, vocabulary_size) if kind == "sent140" else None
    arrays = {}
    for split, users in (("train", train), ("test", test)):
        kept = [name for name in sorted(users) if name in ids and len(users[name][1])]
        if not kept:
            raise FljaxError(f"LEAF directory {directory!r} has no {split} examples of training "
                             f"users")
        x = [e for name in kept for e in users[name][0]]
        y = [e for name in kept for e in users[name][1]]
        owner = np.repeat([ids[name] for name in kept], [len(users[name][1]) for name in kept])
        arrays[split] = (*_encode(kind, x, y, directory, vocabulary), owner.astype(np.int32))
    (x_train, y_train, u_train), (x_test, y_test, u_test) = arrays["train"], arrays["test"]
    if x_train.shape[1:] != x_test.shape[1:]:
        raise FljaxError(f"LEAF train and test examples in {directory!r} have different shapes "
                         f"({x_train.shape[1:]} vs {x_test.shape[1:]})")
    num_classes = {"femnist": 62, "shakespeare": len(LETTERS), "sent140": 2}.get(
        kind, int(max(y_train.max(), y_test.max())) + 1)
    if min(y_train.min(), y_test.min()) < 0 or max(y_train.max(), y_test.max()) >= num_classes:
        raise FljaxError(f"{kind} labels in {directory!r} must lie in [0, {num_classes})")
    return Dataset(f"leaf/{kind}", x_train, y_train, x_test, y_test, num_classes,
                   u_train, u_test)


def write_leaf(directory: str, users: dict, split: str = "all_data",
               users_per_file: int = 100) -> None:
    """Write ``{user: (x list, y list)}`` as LEAF JSON files under ``directory/data/split``."""
    folder = os.path.join(directory, "data", split)
    os.makedirs(folder, exist_ok=True)
    names = sorted(users)
    for start in range(0, len(names), users_per_file):
        chunk = names[start:start + users_per_file]
        content = {"users": chunk, "num_samples": [len(users[n][1]) for n in chunk],
                   "user_data": {n: {"x": list(users[n][0]), "y": list(users[n][1])}
                                 for n in chunk}}
        with open(os.path.join(folder, f"{split}_{start // users_per_file}.json"), "w") as f:
            json.dump(content, f)


def write_synthetic(directory: str, alpha: float = 1.0, beta: float = 1.0, *,
                    num_users: int = 30, max_size: int = 1000, iid: bool = False,
                    seed: int = 0) -> None:
    """FedProx's Synthetic(alpha, beta) users, or Synthetic-IID's if ``iid``
    (``fljax.data.synthetic.generate``: the generator LEAF's synthetic dataset follows), written
    as a LEAF ``all_data`` folder."""
    data = generate(alpha, beta, iid=iid, num_users=num_users, max_size=max_size, seed=seed)
    write_leaf(directory, {f"f_{k:05d}": (x.tolist(), y.tolist())
                           for k, (x, y) in enumerate(zip(data.x, data.y))})


def load_user_npz(path: str) -> Dataset:
    """Your own data with users: an ``.npz`` with x_train, y_train, x_test, y_test and each
    training example's user, ``client_id_train`` (any integers or strings; users are renumbered
    0..U-1 in sorted order). ``client_id_test``, each test example's user, is optional: given, a
    test example of a user without training data is dropped; without it the whole test set is
    kept (the global test set is scored; per-user test sets, --user-test-fraction, come from each
    user's training examples either way). Integer x stays integer (tokens), floating x becomes
    float32; labels may be [N] or [N, ...]."""
    if not os.path.isfile(path):
        raise FljaxError(f"dataset file {path!r} does not exist")
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
    except (OSError, ValueError, EOFError) as err:
        raise FljaxError(f"dataset file {path!r} is not a readable .npz file ({err})") from None
    needed = ("x_train", "y_train", "x_test", "y_test", "client_id_train")
    missing = [k for k in needed if k not in arrays]
    if missing:
        raise FljaxError(f"dataset file {path!r} lacks array(s) {missing}; it needs "
                         f"{list(needed)} (and optionally client_id_test)")
    for split in ("train", "test"):
        x, y = arrays[f"x_{split}"], arrays[f"y_{split}"]
        users = arrays.get(f"client_id_{split}", np.zeros(len(y), np.int32))
        if not (len(x) == len(y) == len(users)) or len(y) == 0:
            raise FljaxError(f"x_{split}, y_{split} and client_id_{split} in {path!r} must have "
                             f"one equal, non-zero length, got {len(x)}, {len(y)}, {len(users)}")
        if not np.issubdtype(y.dtype, np.integer) or users.dtype.kind not in "iuUS":
            raise FljaxError(f"y_{split} in {path!r} must be integers and client_id_{split} "
                             f"integers or strings, got {y.dtype} and {users.dtype}")
    names = np.unique(arrays["client_id_train"])
    keep = (np.isin(arrays["client_id_test"], names) if "client_id_test" in arrays
            else np.ones(len(arrays["y_test"]), bool))
    as_input = lambda x: x.astype(np.float32) if np.issubdtype(x.dtype, np.floating) else x
    y_train, y_test = arrays["y_train"].astype(np.int32), arrays["y_test"][keep].astype(np.int32)
    user_test = (np.searchsorted(names, arrays["client_id_test"][keep]).astype(np.int32)
                 if "client_id_test" in arrays else None)
    return Dataset(os.path.basename(path), as_input(arrays["x_train"]), y_train,
                   as_input(arrays["x_test"][keep]), y_test,
                   int(max(y_train.max(), y_test.max(initial=0))) + 1,
                   np.searchsorted(names, arrays["client_id_train"]).astype(np.int32), user_test)
