import re
import time

import numpy as np
import pytest

from fljax.data import partition as P
from fljax.errors import FljaxError

NUM_CLASSES = 10
LABELS = np.random.default_rng(123).permutation(np.repeat(np.arange(NUM_CLASSES), 200))  # 2000 examples

SPLITTERS = {
    "iid": lambda y, seed: P.iid(y, 20, seed=seed),
    "dirichlet": lambda y, seed: P.dirichlet(y, 20, 0.5, seed=seed),
    "dirichlet_balanced": lambda y, seed: P.dirichlet_balanced(y, 20, 0.5, seed=seed),
    "dirichlet_balanced_replacement": lambda y, seed: P.dirichlet_balanced(
        y, 20, 0.5, seed=seed, replacement=True
    ),
    "classes_per_client": lambda y, seed: P.classes_per_client(y, 20, 2, seed=seed),
}
EXACT = ["iid", "dirichlet", "dirichlet_balanced", "classes_per_client"]  # no replacement, nothing dropped


def _same(a, b):
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("name", SPLITTERS)
def test_reproducible_and_seed_dependent(name):
    split = SPLITTERS[name]
    first, again, other = split(LABELS, 0), split(LABELS, 0), split(LABELS, 1)
    assert _same(first, again)
    assert not _same(first, other)
    for part in first:
        assert part.dtype == np.int64
        assert np.all(np.diff(part) >= 0)


@pytest.mark.parametrize("name", EXACT)
def test_every_example_exactly_once(name):
    parts = SPLITTERS[name](LABELS, 0)
    assert len(parts) == 20
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(len(LABELS)))


def test_iid_sizes_differ_by_at_most_one():
    sizes = [len(p) for p in P.iid(np.arange(103) % 7, 10, seed=0)]
    assert sum(sizes) == 103 and max(sizes) - min(sizes) <= 1


def test_dirichlet_min_size():
    parts = P.dirichlet(LABELS, 20, 0.3, seed=0, min_size=40)
    assert min(len(p) for p in parts) >= 40
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(len(LABELS)))


def test_dirichlet_min_size_unreachable_raises():
    labels = np.repeat(np.arange(2), 50)
    with pytest.raises(FljaxError, match="min_size=30"):
        P.dirichlet(labels, 3, 0.001, seed=0, min_size=30)


@pytest.mark.parametrize(
    "split",
    [
        lambda y, a, s: P.dirichlet(y, 20, a, seed=s),
        lambda y, a, s: P.dirichlet_balanced(y, 20, a, seed=s),
        lambda y, a, s: P.dirichlet_balanced(y, 20, a, seed=s, replacement=True),
    ],
    ids=["dirichlet", "dirichlet_balanced", "dirichlet_balanced_replacement"],
)
def test_skew_grows_as_alpha_falls(split):
    skews = [
        np.mean([P.label_skew(LABELS, split(LABELS, alpha, seed), NUM_CLASSES) for seed in range(3)])
        for alpha in (100, 1, 0.05)
    ]
    assert skews[0] < skews[1] < skews[2]
    assert skews[0] < 0.2 and skews[2] > 0.6


def test_label_skew_extremes():
    assert P.label_skew(LABELS, [np.arange(len(LABELS))], NUM_CLASSES) == 0.0
    one_class = P.classes_per_client(LABELS, NUM_CLASSES, 1, seed=0)
    assert P.label_skew(LABELS, one_class, NUM_CLASSES) == pytest.approx(0.9)


def test_classes_per_client_one_class_each():
    parts = P.classes_per_client(LABELS, NUM_CLASSES, 1, seed=0)
    classes = [np.unique(LABELS[p]) for p in parts]
    assert all(len(c) == 1 for c in classes)
    assert sorted(int(c[0]) for c in classes) == list(range(NUM_CLASSES))
    assert all(len(p) == 200 for p in parts)


def test_classes_per_client_k_classes_and_dropped_classes():
    parts = P.classes_per_client(LABELS, 20, 3, seed=0)
    assert all(len(np.unique(LABELS[p])) == 3 for p in parts)
    few = P.classes_per_client(LABELS, 2, 2, seed=0)  # 4 of 10 classes held, the rest dropped
    held = np.concatenate(few)
    assert len(np.unique(LABELS[held])) == 4 and len(held) == 800


def test_dirichlet_balanced_sizes():
    parts = P.dirichlet_balanced(LABELS, 30, 0.3, seed=0)
    assert {len(p) for p in parts} == {len(LABELS) // 30}
    parts = P.dirichlet_balanced(LABELS, 30, 0.3, seed=0, client_size=50)
    assert {len(p) for p in parts} == {50}
    assert len(np.unique(np.concatenate(parts))) == 30 * 50


def test_dirichlet_balanced_replacement_reuses_examples():
    parts = P.dirichlet_balanced(LABELS, 20, 0.05, seed=0, replacement=True)
    assert {len(p) for p in parts} == {100}
    assert len(np.unique(np.concatenate(parts))) < len(LABELS)  # some examples reused, some unused
    big = P.dirichlet_balanced(LABELS, 20, 1.0, seed=0, replacement=True, client_size=300)  # 6000 > 2000
    assert {len(p) for p in big} == {300}
    assert np.concatenate(big).max() < len(LABELS)


def test_dirichlet_balanced_respects_class_counts_when_prior_is_concentrated():
    labels = np.repeat(np.arange(3), [5, 5, 90])  # tiny classes run out early
    parts = P.dirichlet_balanced(labels, 10, 0.01, seed=0)
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(100))


def test_dirichlet_balanced_is_fast():
    labels = np.random.default_rng(0).integers(0, 10, 50_000)
    start = time.perf_counter()
    parts = P.dirichlet_balanced(labels, 100, 0.1, seed=0)
    assert time.perf_counter() - start < 5.0
    assert {len(p) for p in parts} == {500}


@pytest.mark.parametrize(
    "call, bad",
    [
        (lambda: P.iid(LABELS, 0, seed=0), "0"),
        (lambda: P.iid(LABELS, len(LABELS) + 1, seed=0), "2001"),
        (lambda: P.dirichlet(LABELS, 10, -1.0, seed=0), "-1.0"),
        (lambda: P.dirichlet_balanced(LABELS, 10, 0.0, seed=0), "0.0"),
        (lambda: P.dirichlet(LABELS, 10, 1.0, seed=0, min_size=-3), "-3"),
        (lambda: P.dirichlet_balanced(LABELS, 10, 1.0, seed=0, client_size=201), "201"),
        (lambda: P.classes_per_client(LABELS, 10, 11, seed=0), "11"),
        (lambda: P.classes_per_client(LABELS, 10, 0, seed=0), "0"),
        (lambda: P.iid(LABELS.reshape(40, 50), 2, seed=0), "(40, 50)"),
        (lambda: P.iid(LABELS.astype(np.float32), 2, seed=0), "float32"),
        (lambda: P.iid(np.array([0, -2, 1]), 2, seed=0), "-2"),
        (lambda: P.label_skew(LABELS, [np.arange(5)], 5), "5"),
    ],
)
def test_bad_inputs_raise(call, bad):
    with pytest.raises(FljaxError) as info:
        call()
    assert bad in str(info.value)
    assert "\n" not in str(info.value)


def test_natural_gives_each_user_its_examples():
    users = np.array([2, 0, 1, 2, 2, 0, 1, 1, 2], np.int32)
    parts = P.natural(users, 3)
    assert [p.tolist() for p in parts] == [[1, 5], [2, 6, 7], [0, 3, 4, 8]]
    assert all(p.dtype == np.int64 for p in parts)
    assert P.natural(users, 3)[2].tolist() == parts[2].tolist()  # no randomness


def test_natural_takes_raw_user_ids_in_sorted_order():
    """Ids as a dataset file holds them (arbitrary integers, or strings): the k-th smallest id is
    client k, as the .npz loader numbers them."""
    parts = P.natural(np.array([40, 7, 7, 40, -3, 7]), 3)
    assert [p.tolist() for p in parts] == [[4], [1, 2, 5], [0, 3]]
    parts = P.natural(np.array(["f0_b", "a12", "f0_b", "zz"]), 3)
    assert [p.tolist() for p in parts] == [[1], [0, 2], [3]]


@pytest.mark.parametrize("users, num_clients, message", [
    (np.array([0, 1, 1, 2]), 4, "num_clients must be the dataset's 3 users, got 4"),
    (np.array([0, 2, 2]), 3, "num_clients must be the dataset's 2 users, got 3"),
    (np.array([0.0, 1.0]), 2, "integers or strings"),
    (np.zeros(0, np.int32), 1, "non-empty"),
])
def test_natural_bad_users(users, num_clients, message):
    with pytest.raises(FljaxError, match=re.escape(message)) as info:
        P.natural(users, num_clients)
    assert "\n" not in str(info.value)
