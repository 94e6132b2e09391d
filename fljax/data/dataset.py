"""The Dataset every loader returns: train and test arrays, the number of classes, users."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Dataset(NamedTuple):
    """Train and test arrays; datasets whose clients are given (users) carry each example's user.

    ``user_train`` / ``user_test`` (int32, [N]) hold the user id, 0..U-1, of every example of a
    dataset generated or collected per user (partition ``natural`` makes user u client u); None
    for a centralised dataset that a partitioner splits.
    """

    name: str
    x_train: np.ndarray  # float32 [N, ...]: images [N, H, W, C], signals [N, L, C], vectors [N, D]
    y_train: np.ndarray  # int32, [N]
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    user_train: np.ndarray | None = None  # int32, [N]: user of each training example
    user_test: np.ndarray | None = None   # int32, [N_test]: user of each test example
    # int8 [N]: 0 train, 1 validation, 2 test: each example's part of its user's split where the
    # data fixes it (a graph user's node-split copies); None: fljax.data.users draws the split
    role_train: np.ndarray | None = None
