"""Seeded, reproducible ways to split a labelled training set among federated clients.

Every partitioner takes a 1-D array of non-negative integer labels and returns one sorted int64
array of example indices per client. All randomness comes from ``np.random.default_rng(seed)``,
so the same arguments always give the same split.

* :func:`iid` -- shuffle, then cut into ``num_clients`` nearly equal parts (McMahan et al., 2017).
* :func:`dirichlet` -- label skew of Hsu et al., 2019 ("Measuring the effects of non-identical
  data distribution"), as coded in NIID-Bench (Li et al., 2022): each class is spread over the
  clients with proportions ~ Dir(alpha); client sizes are unequal.
* :func:`dirichlet_balanced` -- the split in the FedDyn code (Acar et al., 2021), also used by
  FedBug and FedInit: each client draws a class prior ~ Dir(alpha) and fills a fixed quota one
  example at a time. ``replacement=True`` is the FL-Simulator variant described in the FedInit
  paper (Sun et al., 2023, appendix B.1), where exhausted classes are refilled.
* :func:`classes_per_client` -- pathological split where each client holds ``k`` classes
  (McMahan et al., 2017; with k=1 and one client per class it is the FedGA EMNIST split of
  Dandi et al., 2022).
* :func:`natural` -- the clients a dataset comes with: one client per user (e.g. the devices of
  FedProx's Synthetic data, :mod:`fljax.data.synthetic`), users given by any integer or string
  ids; not random, no seed.
* :func:`label_skew` -- mean total-variation distance between client and global label
  distributions, to measure how skewed a split is.
"""

from __future__ import annotations

import bisect
import math
import numbers

import numpy as np

from fljax.errors import FljaxError

_MAX_DIRICHLET_DRAWS = 1000


def _check_labels(labels) -> np.ndarray:
    arr = np.asarray(labels)
    if arr.ndim != 1:
        raise FljaxError(f"labels must be a 1-D array, got shape {arr.shape}")
    if arr.size == 0:
        raise FljaxError("labels must not be empty, got 0 labels")
    if not np.issubdtype(arr.dtype, np.integer):
        raise FljaxError(f"labels must be integers, got dtype {arr.dtype}")
    if arr.min() < 0:
        raise FljaxError(f"labels must be >= 0, got {arr.min()}")
    return arr.astype(np.int64)


def _check_int(name: str, value, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise FljaxError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if value < low or (high is not None and value > high):
        allowed = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise FljaxError(f"{name} must be {allowed}, got {value}")
    return value


def _check_alpha(alpha) -> float:
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not 0 < alpha < math.inf:
        raise FljaxError(f"alpha must be a finite number > 0, got {alpha!r}")
    return float(alpha)


def _sorted_parts(parts) -> list[np.ndarray]:
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def iid(labels, num_clients: int, *, seed: int) -> list[np.ndarray]:
    """Shuffle all examples and cut them into ``num_clients`` parts whose sizes differ by at most 1."""
    labels = _check_labels(labels)
    num_clients = _check_int("num_clients", num_clients, 1, len(labels))
    rng = np.random.default_rng(seed)
    return _sorted_parts(np.array_split(rng.permutation(len(labels)), num_clients))


def dirichlet(labels, num_clients: int, alpha: float, *, seed: int, min_size: int = 1) -> list[np.ndarray]:
    """Hsu et al. (2019) / NIID-Bench label-skew split; every example goes to exactly one client.

    For each class, draw proportions ~ Dir(alpha * ones(num_clients)) and cut the class's
    shuffled examples at the cumulative proportions. If any client ends with fewer than
    ``min_size`` examples, everything is drawn again from the same generator (up to 1000 times).
    Unlike the NIID-Bench code, proportions of clients already above N/num_clients are not zeroed.
    """
    labels = _check_labels(labels)
    num_clients = _check_int("num_clients", num_clients, 1, len(labels))
    alpha = _check_alpha(alpha)
    min_size = _check_int("min_size", min_size, 0)
    if min_size * num_clients > len(labels):
        raise FljaxError(
            f"min_size must be <= len(labels) / num_clients = {len(labels) // num_clients}, got {min_size}"
        )
    rng = np.random.default_rng(seed)
    by_class = [np.flatnonzero(labels == c) for c in range(labels.max() + 1)]
    for _ in range(_MAX_DIRICHLET_DRAWS):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for idx in by_class:
            if idx.size == 0:
                continue
            idx = rng.permutation(idx)
            props = rng.dirichlet(np.full(num_clients, alpha))
            cuts = (np.cumsum(props)[:-1] * idx.size).astype(np.int64)
            for client, chunk in enumerate(np.split(idx, cuts)):
                parts[client].append(chunk)
        sizes = [sum(len(c) for c in p) for p in parts]
        if min(sizes) >= min_size:
            return [np.sort(np.concatenate(p)) if p else np.zeros(0, np.int64) for p in parts]
    raise FljaxError(
        f"dirichlet split could not give every client >= min_size={min_size} examples with "
        f"alpha={alpha} and num_clients={num_clients} in {_MAX_DIRICHLET_DRAWS} draws; "
        "use a larger alpha, fewer clients or a smaller min_size"
    )


def dirichlet_balanced(
    labels,
    num_clients: int,
    alpha: float,
    *,
    seed: int,
    replacement: bool = False,
    client_size: int | None = None,
) -> list[np.ndarray]:
    """The FedDyn-code Dirichlet split (Acar et al., 2021; reused by FedBug and FedInit).

    Each client draws a class prior ``rng.dirichlet([alpha] * num_classes)`` and gets exactly
    ``client_size`` examples (default ``len(labels) // num_clients``; the remainder is unused).
    Examples are assigned one at a time: pick a uniformly random client that is not yet full,
    draw a class from its prior, and take the next unused example of that class from a shuffled
    per-class pool.

    * ``replacement=False`` (FedDyn, FedBug): once a class is exhausted, its probability is set
      to zero and the prior is renormalised over the remaining classes (the same distribution as
      the code's "redraw until the class has examples left", but faster). If a client's prior has
      no mass left on any remaining class, it draws uniformly among the remaining classes (the
      reference code would loop forever). Every index is used at most once.
    * ``replacement=True`` (FedInit paper appendix B.1, FL-Simulator code): an exhausted class's
      pool is refilled in the same shuffled order, so an example can go to several clients, and
      to the same client twice if that class's pool wraps around while the client is still
      filling; some examples may be used by no client. ``client_size`` may then exceed
      ``len(labels) // num_clients``.
    """
    labels = _check_labels(labels)
    num_clients = _check_int("num_clients", num_clients, 1, len(labels))
    alpha = _check_alpha(alpha)
    max_size = None if replacement else len(labels) // num_clients
    if client_size is None:
        client_size = len(labels) // num_clients
    client_size = _check_int("client_size", client_size, 1, max_size)

    rng = np.random.default_rng(seed)
    num_classes = int(labels.max()) + 1
    priors = rng.dirichlet(np.full(num_classes, alpha), size=num_clients)
    pools = [rng.permutation(np.flatnonzero(labels == c)) for c in range(num_classes)]
    used = [0] * num_classes
    available = np.array([len(p) > 0 for p in pools])

    def cumulative(mask):
        masked = priors * mask
        empty = masked.sum(axis=1) <= 0
        masked[empty] = mask  # no prior mass left: uniform over the available classes
        return np.cumsum(masked, axis=1).tolist()

    cums = cumulative(available)
    total = num_clients * client_size
    u_client, u_class = rng.random((2, total)).tolist()
    remaining = [client_size] * num_clients
    open_clients = list(range(num_clients))
    parts: list[list[int]] = [[] for _ in range(num_clients)]
    for step in range(total):
        slot = int(u_client[step] * len(open_clients))
        client = open_clients[slot]
        row = cums[client]
        cls = bisect.bisect_right(row, u_class[step] * row[-1])
        if cls == num_classes:  # u * total rounded up to total: take the last class with mass
            cls = bisect.bisect_left(row, row[-1])
        parts[client].append(int(pools[cls][used[cls]]))
        used[cls] += 1
        if used[cls] == len(pools[cls]):
            if replacement:
                used[cls] = 0
            else:
                available[cls] = False
                if step + 1 < total:
                    cums = cumulative(available)
        remaining[client] -= 1
        if remaining[client] == 0:
            open_clients[slot] = open_clients[-1]
            open_clients.pop()
    return _sorted_parts(parts)


def classes_per_client(labels, num_clients: int, classes_per_client: int, *, seed: int) -> list[np.ndarray]:
    """Pathological split: each client holds ``k = classes_per_client`` classes (McMahan et al., 2017).

    With a seeded permutation ``perm`` of the classes, client ``c`` holds classes
    ``perm[(c * k + j) % C]`` for ``j < k``; each class's shuffled examples are split evenly
    among the clients holding it. With k=1 and num_clients == num_classes every client has one
    class (the FedGA EMNIST split, Dandi et al., 2022). Classes no client holds (when
    num_clients * k < C) are dropped, so their examples belong to no client.
    """
    labels = _check_labels(labels)
    num_classes = int(labels.max()) + 1
    num_clients = _check_int("num_clients", num_clients, 1, len(labels))
    k = _check_int("classes_per_client", classes_per_client, 1, num_classes)
    rng = np.random.default_rng(seed)
    perm = rng.permutation(num_classes)
    holders: list[list[int]] = [[] for _ in range(num_classes)]
    for client in range(num_clients):
        for j in range(k):
            holders[perm[(client * k + j) % num_classes]].append(client)
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for cls in range(num_classes):
        if not holders[cls]:
            continue
        idx = rng.permutation(np.flatnonzero(labels == cls))
        for client, chunk in zip(holders[cls], np.array_split(idx, len(holders[cls]))):
            parts[client].append(chunk)
    return [np.sort(np.concatenate(p)) if p else np.zeros(0, np.int64) for p in parts]


def natural(users, num_clients: int) -> list[np.ndarray]:
    """One client per user: client k holds the examples of the k-th user id in sorted order.

    ``users`` is each example's user id: any integers or strings (a dataset's ``user_train``,
    0..U-1, or raw ids such as an .npz file's ``client_id_train``); ``num_clients`` must equal the
    number U of distinct ids (the number of clients is the dataset's, not a choice).
    """
    users = np.asarray(users)
    if users.ndim != 1 or users.size == 0 or users.dtype.kind not in "iuUS":
        raise FljaxError(f"user ids must be a non-empty 1-D array of integers or strings, got "
                         f"shape {users.shape} dtype {users.dtype}")
    _, client, counts = np.unique(users, return_inverse=True, return_counts=True)
    if num_clients != len(counts):
        raise FljaxError(f"partition 'natural' gives one client per user: num_clients must be the "
                         f"dataset's {len(counts)} users, got {num_clients}")
    order = np.argsort(client.reshape(-1), kind="stable")
    return _sorted_parts(np.split(order, np.cumsum(counts)[:-1]))


def label_skew(labels, parts, num_classes: int) -> float:
    """Mean over non-empty clients of the total-variation distance to the global label distribution.

    0 means every client has the global label mix; values near 1 mean clients see disjoint classes.
    """
    labels = _check_labels(labels)
    num_classes = _check_int("num_classes", num_classes, int(labels.max()) + 1)
    global_dist = np.bincount(labels, minlength=num_classes) / len(labels)
    distances = []
    for part in parts:
        part = np.asarray(part, dtype=np.int64)
        if part.size == 0:
            continue
        dist = np.bincount(labels[part], minlength=num_classes) / part.size
        distances.append(0.5 * np.abs(dist - global_dist).sum())
    if not distances:
        raise FljaxError("parts must contain at least one non-empty client, got none")
    return float(np.mean(distances))
