"""The known shapes of the datasets the papers train on, for planning without their data.

``stand_in(name, num_clients)`` is a ``Dataset`` with each split's real number of examples, the
real example shape and dtype, and labels and users laid out like the real ones, whose inputs are
zero-stride views (no memory): enough to split clients, build the model and compile a round for
the real shapes (``fljax.runner.estimate``), never to train. Where a number is not the dataset's
own (a natural dataset's largest user, a graph client's padded size), ``SHAPES[name].note`` says
how it was approximated.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from fljax.data.dataset import Dataset
from fljax.errors import FljaxError


class DatasetShape(NamedTuple):
    example: tuple[int, ...]          # one example's input shape
    dtype: str                        # "float32" (images, features) or "int32" (tokens)
    num_train: int
    num_test: int
    num_classes: int
    label: tuple[int, ...] = ()       # one example's label shape: () or one per position
    users: int = 0                    # natural users (0: a partitioner splits the examples)
    largest_user: int = 0             # the largest user's training examples (natural datasets)
    note: str = ""                    # the source, and what is approximated


SHAPES: dict[str, DatasetShape] = {
    "cifar10": DatasetShape((32, 32, 3), "float32", 50_000, 10_000, 10, note="tfds cifar10"),
    "cifar100": DatasetShape((32, 32, 3), "float32", 50_000, 10_000, 100, note="tfds cifar100"),
    "mnist": DatasetShape((28, 28, 1), "float32", 60_000, 10_000, 10, note="tfds mnist"),
    "fashion_mnist": DatasetShape((28, 28, 1), "float32", 60_000, 10_000, 10,
                                  note="Fashion-MNIST's IDX files"),
    "emnist/balanced": DatasetShape((28, 28, 1), "float32", 112_800, 18_800, 47,
                                    note="tfds emnist/balanced"),
    "emnist/byclass": DatasetShape((28, 28, 1), "float32", 697_932, 116_323, 62,
                                   note="tfds emnist/byclass"),
    "tiny_imagenet": DatasetShape((64, 64, 3), "float32", 100_000, 10_000, 200,
                                  note="tiny-imagenet-200 (train; val as test)"),
    "imagenet_resized/32x32": DatasetShape((32, 32, 3), "float32", 1_281_167, 50_000, 1000,
                                           note="tfds imagenet_resized/32x32 (validation as "
                                                "test)"),
    "glue/sst2": DatasetShape((64,), "int32", 67_349, 872, 2,
                              note="tfds glue/sst2 as 64 WordPiece ids (validation as test)"),
    "leaf/femnist": DatasetShape(
        (28, 28, 1), "float32", 724_736, 80_527, 62, users=3_550, largest_user=450,
        note="LEAF FEMNIST: 3,550 writers, 805,263 images split 90/10 per writer; the "
             "largest writer's 450 training images approximated (mean 204, std 80)"),
    "leaf/shakespeare": DatasetShape(
        (80,), "int32", 378_105, 42_012, 80, label=(80,), users=134, largest_user=12_000,
        note="FedGA's LEAF subsample: 134 roles, 420,117 80-character snippets split 90/10 per "
             "role; the largest role's 12,000 training snippets approximated (about 4x the "
             "mean)"),
}

# Planetoid graphs: one example per client, the client's subgraph padded to the largest client.
GRAPHS = {"planetoid/pubmed": (19_717, 88_648, 500, 3,
                               "PubMed: 19,717 nodes, 88,648 directed edges, 500 features; a "
                               "client's padded subgraph approximated as 1.1x an even share")}


def known(name: str) -> bool:
    return name in SHAPES or name in GRAPHS


def stand_in(name: str, num_clients: int, seed: int = 0, sample_users: int = 0,
             user_split: bool = False) -> Dataset:
    """A memory-free ``Dataset`` of ``name``'s real shapes (module docstring): inputs of zeros as
    zero-stride views, balanced labels in a seeded order, and for a natural dataset its users
    (``users`` clients, or ``sample_users`` of them with their share of the examples, all of the
    mean size but one of ``largest_user``). A graph's clients are one padded subgraph each, or
    with ``user_split`` three (its train, validation and test nodes' copies, as
    ``fljax.data.graphs.federated_graph_dataset`` makes them)."""
    if name in GRAPHS:
        return _graph(name, num_clients, user_split)
    if name not in SHAPES:
        raise FljaxError(f"no known shapes for dataset {name!r}; known: "
                         f"{sorted(SHAPES) + sorted(GRAPHS)} (or give --data-dir to read them "
                         f"from the data)")
    shape = SHAPES[name]
    if sample_users and shape.users:
        share = sample_users / shape.users
        shape = shape._replace(users=sample_users, num_train=int(shape.num_train * share),
                               num_test=int(shape.num_test * share))
    rng = np.random.default_rng(seed)

    def inputs(n):
        return np.broadcast_to(np.zeros((), shape.dtype), (n, *shape.example))

    def labels(n):
        return rng.permutation(np.arange(n) % shape.num_classes).astype(np.int32).reshape(
            (n,) + (1,) * len(shape.label)) * np.ones((1, *shape.label), np.int32)

    users_train = users_test = None
    if shape.users:
        users_train = _users(shape.num_train, shape.users, shape.largest_user)
        users_test = _users(shape.num_test, shape.users, 0)
    return Dataset(name, inputs(shape.num_train), labels(shape.num_train), inputs(shape.num_test),
                   labels(shape.num_test), shape.num_classes, users_train, users_test)


def _users(total: int, users: int, largest: int) -> np.ndarray:
    """[total] user ids: user 0 holds ``largest`` examples (if > 0), the rest share evenly."""
    first = largest if largest else total // users
    rest = np.arange(total - first) % (users - 1) + 1
    return np.concatenate([np.zeros(first, np.int32), np.sort(rest).astype(np.int32)])


def _graph(name: str, num_clients: int, user_split: bool) -> Dataset:
    nodes, edges, features, classes, _ = GRAPHS[name]
    v_max = int(1.1 * nodes / num_clients) + 1
    e_max = int(1.1 * edges / num_clients) + 1
    zeros = lambda shape, dtype: np.broadcast_to(np.zeros((), dtype), shape)
    x = {"nodes": zeros((num_clients, v_max, features), np.float32),
         "senders": zeros((num_clients, e_max), np.int32),
         "receivers": zeros((num_clients, e_max), np.int32),
         "edge_mask": zeros((num_clients, e_max), np.float32),
         "node_mask": zeros((num_clients, v_max), np.float32)}
    y = np.arange(num_clients * v_max, dtype=np.int32).reshape(num_clients, v_max) % classes
    users = np.arange(num_clients, dtype=np.int32)
    if not user_split:
        return Dataset(name, x, y, x, y, classes, users, users)
    copies = {k: np.broadcast_to(v[:1], (3 * num_clients, *v.shape[1:])) for k, v in x.items()}
    return Dataset(name, copies, np.repeat(y, 3, axis=0), x, y, classes, np.repeat(users, 3),
                   users, np.tile(np.arange(3, dtype=np.int8), num_clients))
