"""Byzantine-robust aggregation rules, as pure functions on a stack of client messages.

Every rule takes ``x``, a float array ``[m, d]`` (m client slots, one flattened message per row),
and ``mask``, a bool ``[m]`` saying which rows are real. A masked row is ignored exactly as if it
were absent: n = ``mask.sum()`` real rows, which may be a traced value. Nothing here uses n for a
shape: values are sorted with the masked rows pushed to the end and kept or dropped by positional
masks (``arange(m) < n - f``), so every function runs under ``jax.jit`` and ``jax.vmap`` and
compiles once per shape ``[m, d]``.

``f``, the number of Byzantine clients assumed, may be a Python number or a traced scalar
everywhere; only loop counts (``iterations``) must be static. The rules' preconditions on n and f
(n > 2f for the trimmed mean, n > f + 2 for Krum, n >= 4f + 3 for Bulyan) cannot be checked on
traced values: the caller checks them on the cohort size it plans for. An empty cohort (n = 0) has
no aggregate; the results are then undefined (inf or nan) and the caller keeps its fallback with
``jnp.where``.

Aggregators return one row ``[d]``. Pre-aggregators (nearest-neighbor mixing, bucketing, adaptive
robust clipping) return a new stack and mask ``([m, d], [m])``, masked rows zero, to be handed to
an aggregator.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

__all__ = [
    "adaptive_robust_clipping", "bucketing", "bulyan", "centered_clipping", "coordinate_median",
    "geometric_median", "krum", "krum_scores", "multi_krum", "nearest_neighbor_mixing",
    "trimmed_mean", "weighted_mean",
]


def _count(mask):
    return jnp.sum(mask, dtype=jnp.int32)


def _zero_masked(x, mask):
    """The stack with its masked rows 0, so that a weight 0 on them cannot meet an inf or nan."""
    return jnp.where(mask[:, None], x, 0.0)


def _mean_of_rows(weights, x):
    """``weights @ x`` in full float32: a plain dot may run in TF32 on GPUs."""
    return jnp.matmul(weights, x, precision=lax.Precision.HIGHEST)


def _sorted_columns(x, mask):
    """Each coordinate's real values in ascending order, the masked rows' +inf after them (a nan
    counts as +inf, as ``jnp.sort`` puts it last)."""
    values = jnp.where(mask[:, None] & ~jnp.isnan(x), x, jnp.inf)
    return _bitonic_sort_rows(values)


def _bitonic_sort_rows(x):
    """``jnp.sort(x, axis=0)`` for an ``[m, d]`` array of numbers without nan, by Batcher's
    bitonic sorting network (K. E. Batcher, "Sorting networks and their applications", AFIPS 1968):
    the rows padded with +inf to M = 2^ceil(log2 m), then log2(M)(log2(M)+1)/2 stages; the stage
    (k, j) compares rows i and i xor j and puts the smaller first where i & k == 0, last elsewhere.
    Every stage is one elementwise min and max over the whole stack, so the sort is a few dozen
    vectorized passes over [M, d]. XLA's CPU sort of the columns is 10-30x slower at m = 10-1000."""
    m = x.shape[0]
    size = 1 << max(m - 1, 0).bit_length()
    if size > m:
        x = jnp.concatenate([x, jnp.full((size - m,) + x.shape[1:], jnp.inf, x.dtype)])
    k = 2
    while k <= size:
        j = k // 2
        while j >= 1:
            pairs = x.reshape(size // (2 * j), 2, j, -1)
            first, second = pairs[:, 0], pairs[:, 1]
            ascending = (((jnp.arange(size // (2 * j)) * 2 * j) & k) == 0)[:, None, None]
            low, high = jnp.minimum(first, second), jnp.maximum(first, second)
            x = jnp.stack([jnp.where(ascending, low, high), jnp.where(ascending, high, low)],
                          axis=1).reshape(x.shape)
            j //= 2
        k *= 2
    return x[:m]


def _squared_distances(x, chunk=256):
    """``[m, m]`` squared Euclidean distances ||x_i - x_j||^2, from the differences themselves:
    exactly symmetric and exactly 0 between equal rows, where the Gram form
    ``|a|^2 + |b|^2 - 2 a.b`` cancels badly in float32.

    The coordinates are taken ``chunk`` at a time (zero-padded to a multiple of it, which adds
    exact zeros): each chunk adds sum_k (x_ik - x_jk)^2 over its columns to all m^2 pairs at once,
    a fused [m, m, chunk] reduction over a slice of x small enough to stay in cache. Memory
    O(m^2 + m d); taking one row at a time instead rereads the whole stack m times (30x slower
    at m = 1000, d = 55,210 on a CPU; ``benchmarks/robust_cost.py``).
    """
    m, d = x.shape
    chunk = min(chunk, d)
    padded = jnp.pad(x, ((0, 0), (0, -d % chunk)))
    columns = padded.reshape(m, -1, chunk).transpose(1, 0, 2)          # [chunks, m, chunk]

    def add_chunk(total, part):
        return total + jnp.sum(jnp.square(part[:, None, :] - part[None, :, :]), axis=2), None

    return lax.scan(add_chunk, jnp.zeros((m, m), x.dtype), columns)[0]


def weighted_mean(x, mask, weights=None):
    """sum_i w_i x_i / sum_i w_i over the real rows (w = 1 when ``weights`` is None).

    The plain federated average (McMahan et al., "Communication-Efficient Learning of Deep Networks
    from Decentralized Data", AISTATS 2017), the non-robust reference.
    """
    w = jnp.where(mask, 1.0 if weights is None else weights, 0.0).astype(x.dtype)
    return jnp.sum(w[:, None] * _zero_masked(x, mask), axis=0) / jnp.sum(w)


def coordinate_median(x, mask):
    """Coordinate-wise median: [out]_k = median_i [x_i]_k over the n real rows.

    Yin, Chen, Ramchandran, Bartlett, "Byzantine-Robust Distributed Learning: Towards Optimal
    Statistical Rates", ICML 2018. For even n the mean of the two middle values (numpy's
    convention; the paper's analysis does not depend on it).
    """
    values = _sorted_columns(x, mask)
    n = _count(mask)
    return (values[(n - 1) // 2] + values[n // 2]) / 2


def trimmed_mean(x, mask, f):
    """Coordinate-wise trimmed mean: per coordinate, drop the f smallest and the f largest of the n
    real values and average the n - 2f left:

        [out]_k = 1/(n - 2f) sum_{j=f+1}^{n-f} [x_(j)]_k     ([x_(1)]_k <= ... <= [x_(n)]_k)

    Yin et al., ICML 2018 (the beta-trimmed mean with beta = f/n). f is a count cut from EACH side,
    as ByzFL's TrMean, not Flower's fraction. Needs n > 2f.
    """
    values = _sorted_columns(x, mask)
    n = _count(mask)
    position = jnp.arange(x.shape[0])[:, None]
    kept = (position >= f) & (position < n - f)
    return jnp.sum(jnp.where(kept, values, 0.0), axis=0) / (n - 2 * f)


def _krum_scores_from_distances(distances, mask, f):
    m = distances.shape[0]
    others = mask[None, :] & ~jnp.eye(m, dtype=bool)
    nearest = jnp.sort(jnp.where(others, distances, jnp.inf), axis=1)
    kept = jnp.arange(m) < _count(mask) - f - 2
    scores = jnp.sum(jnp.where(kept, nearest, 0.0), axis=1)
    return jnp.where(mask, scores, jnp.inf)


def krum_scores(x, mask, f):
    """Krum's score of every row: the sum of its squared distances to its n - f - 2 nearest other
    real rows; +inf for masked rows.

        score(i) = sum_{j in N_i} ||x_i - x_j||^2,   N_i: the n - f - 2 closest x_j, j != i

    Blanchard, El Mhamdi, Guerraoui, Stainer, "Machine Learning with Adversaries: Byzantine
    Tolerant Gradient Descent", NeurIPS 2017. This is the paper's n - f - 2 (ByzFL sums n - f - 1
    neighbors). Needs n > f + 2 (n >= 2f + 3 for the paper's guarantee).
    """
    return _krum_scores_from_distances(_squared_distances(x), mask, f)


def krum(x, mask, f):
    """Krum: the real row of least ``krum_scores`` (Blanchard et al., NeurIPS 2017). Ties: the
    lowest row index wins."""
    return x[jnp.argmin(krum_scores(x, mask, f))]


def multi_krum(x, mask, f, q):
    """Multi-Krum: the mean of the q real rows of least ``krum_scores``.

        out = 1/q sum_{i in S} x_i,   S: the q rows of least score

    The variant of Krum that averages several selected rows (Blanchard et al., NeurIPS 2017, in its
    experiments), named Multi-Krum by El Mhamdi, Guerraoui, Rouault, "The Hidden Vulnerability of
    Distributed Learning in Byzantium", ICML 2018. q = 1 is Krum; ByzFL's default is q = n - f.
    q may be traced; needs 1 <= q <= n. Ties in score: the lower row index is selected first.
    """
    scores = krum_scores(x, mask, f)
    rank = jnp.argsort(jnp.argsort(scores, stable=True))
    selected = (rank < q) & mask
    return _mean_of_rows(selected.astype(x.dtype), _zero_masked(x, mask)) / jnp.sum(selected)


def bulyan(x, mask, f):
    """Bulyan over Krum (El Mhamdi, Guerraoui, Rouault, "The Hidden Vulnerability of Distributed
    Learning in Byzantium", ICML 2018).

    1. Select theta = n - 2f rows by repeated Krum: Krum (with the same f) picks a row of the
       remaining set, which is removed from it; repeat theta times.
    2. Per coordinate k, with med_k the median of the selected rows' values, average the
       beta = theta - 2f selected values closest to med_k:

        [out]_k = 1/beta sum_{j in M_k} [x_j]_k,   M_k: the beta values with least |[x_j]_k - med_k|

    Needs n >= 4f + 3 (beta = n - 4f >= 3); with a traced n this cannot be raised: the caller
    checks it. Each Krum round scores with the neighbors of the shrinking set R, |R| - f - 2 of
    them; the last rounds (|R| down to 2f + 1) have few: one at f = 2, where two mutual nearest
    neighbors tie, none at f = 1, where every row scores 0. Ties: Krum's, the lowest row index
    wins, so the selection can depend on the row order at small f; among values equally distant
    from the median the smaller is taken first. The selection runs theta Krum rounds on the
    distances computed and sorted once: O(m^2 d + m^3) work.
    """
    n = _count(mask)
    theta = jnp.asarray(n - 2 * f).astype(jnp.int32)   # f may come as a float (a whole number)
    beta = jnp.asarray(theta - 2 * f).astype(jnp.int32)
    selected = _repeated_krum(_squared_distances(x), mask, f, theta)
    values = _sorted_columns(x, selected)
    median = (values[(theta - 1) // 2] + values[theta // 2]) / 2
    return _sum_closest_to(values, median, theta, beta) / beta


def _repeated_krum(distances, mask, f, count):
    """The mask of the ``count`` rows (may be traced) chosen one by one by Krum on the shrinking
    remaining set R, each round's pick removed from R (Bulyan's selection).

    Each row's other rows are sorted by distance once; row i's Krum neighbors on R ("kept", in
    sorted positions) are its first |R| - f - 2 members of R other than itself. When R loses a row,
    every row keeps one neighbor fewer: that row where it was kept, else its farthest kept one; so
    a round costs O(m^2), with no sort.
    """
    m = distances.shape[0]
    position = jnp.arange(m)
    nearest_first = jnp.argsort(distances, axis=1)
    nearest_distances = jnp.take_along_axis(distances, nearest_first, axis=1)
    rank = jnp.argsort(nearest_first, axis=1)                  # rank[i, j]: j's position in row i
    neighbors = mask[nearest_first] & (nearest_first != position[:, None])
    kept = neighbors & (jnp.cumsum(neighbors, axis=1) <= _count(mask) - f - 2)

    def select_one(_, sets):
        remaining, selected, kept = sets
        scores = jnp.sum(jnp.where(kept, nearest_distances, 0.0), axis=1)
        best = jnp.argmin(jnp.where(remaining, scores, jnp.inf))
        best_rank = rank[:, best]
        farthest = jnp.max(jnp.where(kept, position, -1), axis=1)
        dropped = jnp.where(kept[position, best_rank], best_rank, farthest)
        picked = position == best
        return remaining & ~picked, selected | picked, kept & (position != dropped[:, None])

    return lax.fori_loop(0, count, select_one, (mask, jnp.zeros(m, bool), kept))[1]


def _sum_closest_to(values, center, count, closest):
    """Per column k, the sum of the ``closest`` of its first ``count`` values nearest to
    ``center[k]``, the column sorted ascending: they form a window around the center, grown one
    value at a time from the two sides, the smaller value first where both are equally far (the
    order of a stable sort by |v - center|). O(m d), where sorting the distances is O(m d log m).
    """
    m = values.shape[0]
    below = jnp.sum(values < center, axis=0)                   # the window starts between

    def take_nearer(_, window):
        left, right, total = window                            # the next candidates
        left_value = jnp.take_along_axis(values, jnp.maximum(left, 0)[None], axis=0)[0]
        right_value = jnp.take_along_axis(values, jnp.minimum(right, m - 1)[None], axis=0)[0]
        left_gap = jnp.where(left >= 0, center - left_value, jnp.inf)
        right_gap = jnp.where(right < count, right_value - center, jnp.inf)
        take_left = left_gap <= right_gap
        taken = jnp.where(take_left, left_value, right_value)
        return left - take_left, right + ~take_left, total + taken

    start = (below - 1, below, jnp.zeros(values.shape[1], values.dtype))
    return lax.fori_loop(0, closest, take_nearer, start)[2]


def geometric_median(x, mask, weights=None, *, nu=1e-6, iterations=8, start=None):
    """Approximate weighted geometric median argmin_v sum_i alpha_i ||v - x_i|| by the smoothed
    Weiszfeld algorithm of RFA (Pillutla, Kakade, Harchaoui, "Robust Aggregation for Federated
    Learning", IEEE Transactions on Signal Processing, 2022):

        v <- sum_i beta_i x_i / sum_i beta_i,   beta_i = alpha_i / max(nu, ||v - x_i||)

    ``weights`` alpha (all 1 when None), ``nu`` the smoothing (may be traced), ``iterations`` a
    static count (the paper reports a few suffice), ``start`` the first v (default: the weighted
    mean, as in RFA).
    """
    alpha = jnp.where(mask, 1.0 if weights is None else weights, 0.0).astype(x.dtype)
    x = _zero_masked(x, mask)
    v = weighted_mean(x, mask, alpha) if start is None else jnp.asarray(start, x.dtype)

    def weiszfeld_step(_, v):
        beta = alpha / jnp.maximum(nu, jnp.linalg.norm(x - v, axis=1))
        return jnp.sum(beta[:, None] * x, axis=0) / jnp.sum(beta)

    return lax.fori_loop(0, iterations, weiszfeld_step, v)


def _clip_factors(norms, threshold):
    """min(1, threshold / norm), 1 where the norm is within the threshold (0 and inf included)."""
    return jnp.where(norms > threshold, threshold / jnp.where(norms > threshold, norms, 1.0), 1.0)


def centered_clipping(x, mask, center, *, tau, iterations=1):
    """Centered clipping (Karimireddy, He, Jaggi, "Learning from History for Byzantine Robust
    Optimization", ICML 2021), L = ``iterations`` (static) steps from v = ``center``:

        v <- v + 1/n sum_i clip_tau(x_i - v),   clip_tau(z) = z min(1, tau / ||z||)

    ``center`` is the previous round's aggregate (the paper starts from it; the caller keeps it in
    its state). tau = inf gives the mean after one step. tau may be traced.
    """
    n = _count(mask)
    x = _zero_masked(x, mask)

    def clipping_step(_, v):
        z = x - v
        factors = jnp.where(mask, _clip_factors(jnp.linalg.norm(z, axis=1), tau), 0.0)
        return v + jnp.sum(factors[:, None] * z, axis=0) / n

    return lax.fori_loop(0, iterations, clipping_step, jnp.asarray(center, x.dtype))


def nearest_neighbor_mixing(x, mask, f):
    """Nearest-neighbor mixing (NNM; Allouah, Farhadkhani, Guerraoui, Gupta, Pinot, Stephan,
    "Fixing by Mixing: A Recipe for Optimal Byzantine ML under Heterogeneity", AISTATS 2023):
    every real row is replaced by the mean of its n - f nearest real rows, itself included.

        y_i = 1/(n - f) sum_{j in N_i} x_j,   N_i: the n - f real rows closest to x_i

    Returns ``(y, mask)``, masked rows zero. Ties in distance: the lower row index is taken first.
    """
    n = _count(mask)
    distances = jnp.where(mask[None, :], _squared_distances(x), jnp.inf)
    order = jnp.argsort(distances, axis=1, stable=True)
    rank = jnp.argsort(order, axis=1)
    neighbors = (rank < n - f) & mask[:, None] & mask[None, :]
    mixed = _mean_of_rows(neighbors.astype(x.dtype), _zero_masked(x, mask)) / (n - f)
    return jnp.where(mask[:, None], mixed, 0.0), mask


def bucketing(x, mask, key, bucket_size):
    """Bucketing (Karimireddy, He, Jaggi, "Byzantine-Robust Learning on Heterogeneous Datasets via
    Bucketing", ICLR 2022): the real rows in a random order pi (drawn from ``key``) are cut into
    ceil(n / s) consecutive buckets of s = ``bucket_size`` rows, and each bucket is averaged:

        y_b = mean of x_pi(k) for k = (b - 1) s + 1, ..., min(n, b s),   b = 1, ..., ceil(n / s)

    When s does not divide n the last bucket averages its own n - (ceil(n/s) - 1) s rows (as
    ByzFL does). Returns ``(y, new_mask)``: the bucket means in the first ceil(n / s) rows, zeros
    after. ``bucket_size`` may be traced.
    """
    m = x.shape[0]
    n = _count(mask)
    shuffled = jax.random.permutation(key, m)
    order = shuffled[jnp.argsort(~mask[shuffled], stable=True)]   # real rows first, shuffled
    position = jnp.arange(m)
    bucket_of_position = jnp.where(position < n, position // bucket_size, -1)
    members = bucket_of_position[None, :] == position[:, None]            # [bucket, position]
    sizes = jnp.maximum(jnp.sum(members, axis=1), 1).astype(x.dtype)
    means = _mean_of_rows(members.astype(x.dtype), _zero_masked(x, mask)[order]) / sizes[:, None]
    return means, position < (n + bucket_size - 1) // bucket_size


def adaptive_robust_clipping(x, mask, f):
    """Adaptive robust clipping (ARC; Allouah, Guerraoui, Gupta, Jellouli, Rizk, Stephan, "Adaptive
    Gradient Clipping for Robust Federated Learning", ICLR 2025; arXiv 2405.14432, first titled
    "The Vital Role of Gradient Clipping in Byzantine-Resilient Distributed Learning"):
    with the real rows' norms in non-increasing order ||x_pi(1)|| >= ... >= ||x_pi(n)||,

        k = floor(2 (f / n) (n - f)),   C = ||x_pi(k+1)||,   y_i = x_i min(1, C / ||x_i||)

    so the k largest rows are clipped to the (k+1)-th largest norm and the others kept (f = 0:
    nothing clipped); k as in ByzFL's ARC, which cites this paper. Ties in norm need no rule: C is
    a value. Returns ``(y, mask)``, masked rows zero.
    """
    n = _count(mask)
    x = _zero_masked(x, mask)
    norms = jnp.linalg.norm(x, axis=1)
    clipped_count = ((2 * f * (n - f)) // n).astype(jnp.int32)   # floor, exact on integers
    threshold = -jnp.sort(jnp.where(mask, -norms, jnp.inf))[clipped_count]
    factors = jnp.where(mask, _clip_factors(norms, threshold), 0.0)
    return factors[:, None] * x, mask
