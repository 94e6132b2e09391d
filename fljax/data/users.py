"""Users for personalized evaluation: existing users train in the federation, new users are held out;
every user's examples are split into its own train / val / test (FedDecay (Anonymous, 2023),
section 4).

FedDecay evaluates generalization in two ways (after Yuan et al. 2022 and pFL-Bench): to new users
(the participation gap: a share of the clients, 20% in the paper, never trains) and to new data of
existing users (the out-of-sample gap: each user's data is divided into train, validation and test,
0.6 / 0.2 / 0.2 in pFL-Bench). Only the existing users' train splits enter federated training.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np

from fljax.errors import FljaxError


class Users(NamedTuple):
    existing: np.ndarray        # ids (into the partition) of the users that train, ascending
    new: np.ndarray             # ids of the held-out users, ascending
    train: list[np.ndarray]     # per user (all users, partition order): its training example ids
    val: list[np.ndarray]       # ... its validation example ids (empty when val_fraction = 0)
    test: list[np.ndarray]      # ... its test example ids


def _check_fraction(name: str, value, *, top: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < top:
        raise FljaxError(f"{name} must be a number in [0, {top:g}), got {value!r}")
    return float(value)


def held_out(n: int, fraction: float) -> int:
    """round(fraction * n), at least 1 when fraction > 0."""
    return max(1, round(fraction * n)) if fraction > 0 else 0


def split_users(parts: Sequence[np.ndarray], *, new_fraction: float, val_fraction: float,
                test_fraction: float, seed: int, roles: np.ndarray | None = None) -> Users:
    """Hold out ``round(new_fraction * C)`` of the C users (at least one if the fraction is > 0)
    and split each user's examples into train / val / test with ``round(fraction * n_u)`` examples
    in val and in test (at least one each when its fraction is > 0); seeded, reproducible.
    ``roles`` (0 train, 1 val, 2 test per example id, ``Dataset.role_train``): the split the data
    fixes, used instead of drawing one."""
    new_fraction = _check_fraction("new_users", new_fraction, top=1.0)
    val_fraction = _check_fraction("user_val_fraction", val_fraction, top=1.0)
    test_fraction = _check_fraction("user_test_fraction", test_fraction, top=1.0)
    if val_fraction + test_fraction >= 1.0:
        raise FljaxError(f"user_val_fraction + user_test_fraction must be < 1 (the rest is each "
                         f"user's training data), got {val_fraction} + {test_fraction}")
    rng = np.random.default_rng(seed)
    num_users = len(parts)
    num_new = held_out(num_users, new_fraction)
    if num_new >= num_users:
        raise FljaxError(f"new_users={new_fraction} holds out {num_new} of the {num_users} users, "
                         f"leaving none to train; use a smaller fraction or more clients")
    new = np.sort(rng.permutation(num_users)[:num_new])
    existing = np.setdiff1d(np.arange(num_users), new)
    train, val, test = [], [], []
    if roles is not None:
        for ids in map(np.asarray, parts):
            for split, role in ((train, 0), (val, 1), (test, 2)):
                split.append(np.sort(ids[roles[ids] == role]))
        return Users(existing, new, train, val, test)
    for user, ids in enumerate(parts):
        ids = rng.permutation(np.asarray(ids))
        n_val, n_test = held_out(len(ids), val_fraction), held_out(len(ids), test_fraction)
        if len(ids) - n_val - n_test < 1:
            raise FljaxError(f"user {user} has {len(ids)} examples: too few to keep {n_val} for "
                             f"validation, {n_test} for test and at least 1 for training; use "
                             f"fewer clients or a larger min_size")
        val.append(np.sort(ids[:n_val]))
        test.append(np.sort(ids[n_val:n_val + n_test]))
        train.append(np.sort(ids[n_val + n_test:]))
    return Users(existing, new, train, val, test)
