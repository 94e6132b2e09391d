"""The robust aggregation rules against float64 NumPy references written from their papers'
equations, and their contract: masked rows are absent, row order does not matter, f may be
traced, and every rule runs under jax.vmap."""

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fljax.robustness import aggregators as agg

N, D = 11, 5             # real rows, coordinates
GARBAGE_AT = (3, 9)      # masked slots of the [N + 2, D] stack
CENTER, TAU, CLIP_STEPS = 0.3, 1.0, 3


def row_weights(x, xp):
    return 1.0 + xp.abs(x[:, 0])


# ---- float64 references, one per equation ----

def ref_weighted_mean(x, f):
    w = row_weights(x, np)
    return w @ x / w.sum()


def ref_median(x, f):
    return np.median(x, axis=0)


def ref_trimmed_mean(x, f):
    return np.sort(x, axis=0)[f:len(x) - f].mean(axis=0)


def ref_krum_scores(x, f):
    n = len(x)
    scores = []
    for i in range(n):
        others = sorted(np.sum((x[i] - x[j]) ** 2) for j in range(n) if j != i)
        scores.append(sum(others[:max(n - f - 2, 0)]))
    return np.array(scores)


def ref_krum(x, f):
    return x[np.argmin(ref_krum_scores(x, f))]           # argmin: the lowest index of a tie


def ref_multi_krum(x, f):
    chosen = np.argsort(ref_krum_scores(x, f), kind="stable")[:len(x) - f]
    return x[chosen].mean(axis=0)


def ref_bulyan(x, f):
    theta = len(x) - 2 * f
    remaining, chosen = list(range(len(x))), []
    for _ in range(theta):
        pick = remaining[int(np.argmin(ref_krum_scores(x[remaining], f)))]
        remaining.remove(pick)
        chosen.append(pick)
    out = []
    for values in np.sort(x[chosen], axis=0).T:
        closest = np.argsort(np.abs(values - np.median(values)), kind="stable")[:theta - 2 * f]
        out.append(values[closest].mean())
    return np.array(out)


def ref_geometric_median(x, f, nu=1e-6, iterations=8):
    alpha = row_weights(x, np)
    v = alpha @ x / alpha.sum()
    for _ in range(iterations):
        beta = alpha / np.maximum(nu, np.linalg.norm(x - v, axis=1))
        v = beta @ x / beta.sum()
    return v


def ref_centered_clipping(x, f):
    v = np.full(x.shape[1], CENTER)
    for _ in range(CLIP_STEPS):
        z = x - v
        v = v + (z * np.minimum(1.0, TAU / np.linalg.norm(z, axis=1))[:, None]).mean(axis=0)
    return v


def ref_nearest_neighbor_mixing(x, f):
    n = len(x)
    return np.array([x[np.argsort(np.sum((x - xi) ** 2, axis=1), kind="stable")[:n - f]].mean(0)
                     for xi in x])


def ref_adaptive_robust_clipping(x, f):
    n = len(x)
    norms = np.linalg.norm(x, axis=1)
    threshold = np.sort(norms)[::-1][2 * f * (n - f) // n]
    return x * np.minimum(1.0, threshold / norms)[:, None]


# ---- the rules under test, each as (x, mask, f) -> array ----

class Case(NamedTuple):
    run: Callable
    reference: Callable
    rowwise: bool = False     # one output per input row (scores, pre-aggregators)


CASES = {
    "weighted_mean": Case(lambda x, mask, f: agg.weighted_mean(x, mask, row_weights(x, jnp)),
                          ref_weighted_mean),
    "coordinate_median": Case(lambda x, mask, f: agg.coordinate_median(x, mask), ref_median),
    "trimmed_mean": Case(agg.trimmed_mean, ref_trimmed_mean),
    "krum_scores": Case(agg.krum_scores, ref_krum_scores, rowwise=True),
    "krum": Case(agg.krum, ref_krum),
    "multi_krum": Case(lambda x, mask, f: agg.multi_krum(x, mask, f, mask.sum() - f),
                       ref_multi_krum),
    "bulyan": Case(agg.bulyan, ref_bulyan),
    "geometric_median": Case(lambda x, mask, f: agg.geometric_median(x, mask, row_weights(x, jnp)),
                             ref_geometric_median),
    "centered_clipping": Case(
        lambda x, mask, f: agg.centered_clipping(x, mask, jnp.full(x.shape[1], CENTER), tau=TAU,
                                                 iterations=CLIP_STEPS),
        ref_centered_clipping),
    "nearest_neighbor_mixing": Case(lambda x, mask, f: agg.nearest_neighbor_mixing(x, mask, f)[0],
                                    ref_nearest_neighbor_mixing, rowwise=True),
    "adaptive_robust_clipping": Case(lambda x, mask, f: agg.adaptive_robust_clipping(x, mask, f)[0],
                                     ref_adaptive_robust_clipping, rowwise=True),
}
JITTED = {name: jax.jit(case.run) for name, case in CASES.items()}   # f traced: one compile
TOLERANCE = dict(rtol=1e-5, atol=1e-5)


def real_rows(kind, n=N, seed=0):
    """[n, D] float32 rows; "ties": small integers with three equal rows."""
    rng = np.random.default_rng(seed)
    if kind == "ties":
        x = rng.integers(0, 3, (n, D)).astype(float)
        x[[4, 7]] = x[1]
    else:
        x = rng.normal(size=(n, D))
    return x.astype(np.float32)


def with_garbage(x, seed=1, garbage_at=GARBAGE_AT):
    """x inside a larger stack: masked slots of large garbage at ``garbage_at``."""
    m = len(x) + len(garbage_at)
    mask = np.ones(m, bool)
    mask[list(garbage_at)] = False
    stack = 50 * np.random.default_rng(seed).normal(size=(m, x.shape[1])).astype(np.float32)
    stack[mask] = x
    return stack, mask


@pytest.mark.parametrize("n", [N, N - 1], ids=["odd-n", "even-n"])
@pytest.mark.parametrize("kind", ["gaussian", "ties"])
@pytest.mark.parametrize("f", [0, 1, 2])
@pytest.mark.parametrize("name", CASES)
def test_matches_the_float64_reference(name, f, kind, n):
    if name == "bulyan" and n < 4 * f + 3:
        pytest.skip("Bulyan needs n >= 4f + 3")
    x = real_rows(kind, n)      # n = N - 1: a third masked slot keeps the [N + 2, D] stack
    stack, mask = with_garbage(x, garbage_at=GARBAGE_AT + (N + 1,) * (n < N))
    got = np.asarray(JITTED[name](stack, mask, f))
    if CASES[name].rowwise:
        got = got[mask]
    np.testing.assert_allclose(got, CASES[name].reference(x.astype(np.float64), f), **TOLERANCE)


@pytest.mark.parametrize("name", CASES)
def test_row_order_changes_nothing(name):
    # Bulyan's last Krum round (2f + 1 rows) scores with f - 1 neighbors: at f = 2 two mutual
    # nearest neighbors tie and the lower index wins, so its order test takes f = 3 on 15 rows
    rows, f = (real_rows("gaussian", 15), 3) if name == "bulyan" else (real_rows("gaussian"), 2)
    stack, mask = with_garbage(rows)
    order = np.random.default_rng(2).permutation(len(stack))
    got = np.asarray(JITTED[name](stack[order], mask[order], f))
    want = np.asarray(JITTED[name](stack, mask, f))
    np.testing.assert_allclose(got, want[order] if CASES[name].rowwise else want, **TOLERANCE)


@pytest.mark.parametrize("name", CASES)
def test_masked_rows_are_absent_rows(name):
    x = real_rows("gaussian")
    stack, mask = with_garbage(x)
    got = np.asarray(JITTED[name](stack, mask, 2))
    want = np.asarray(JITTED[name](x, np.ones(N, bool), 2))
    np.testing.assert_allclose(got[mask] if CASES[name].rowwise else got, want, **TOLERANCE)


@pytest.mark.parametrize("name", CASES)
def test_traced_f_equals_static_f(name):
    stack, mask = with_garbage(real_rows("gaussian"))
    static = jax.jit(lambda x, mask: CASES[name].run(x, mask, 2))(stack, mask)
    np.testing.assert_allclose(JITTED[name](stack, mask, 2), static, rtol=1e-6, atol=1e-6)
    # a whole number as a float32, as a traced hyperparameter of a batched run arrives
    np.testing.assert_allclose(JITTED[name](stack, mask, np.float32(2)), static, rtol=1e-6,
                               atol=1e-6)


@pytest.mark.parametrize("name", CASES)
def test_vmap_over_runs_with_their_own_mask_and_f(name):
    stacks = np.stack([with_garbage(real_rows("gaussian", seed=seed))[0] for seed in (0, 1)])
    masks = np.stack([with_garbage(real_rows("gaussian"))[1], np.arange(N + 2) != 5])
    fs = np.array([1, 2])
    batched = jax.jit(jax.vmap(CASES[name].run))(stacks, masks, fs)
    for run in range(2):
        np.testing.assert_allclose(batched[run], JITTED[name](stacks[run], masks[run], fs[run]),
                                   **TOLERANCE)


def test_f_zero_trims_nothing_and_mixes_everything():
    x = real_rows("gaussian")
    mask = np.ones(N, bool)
    mean = x.astype(np.float64).mean(axis=0)
    np.testing.assert_allclose(JITTED["trimmed_mean"](x, mask, 0), mean, **TOLERANCE)
    np.testing.assert_allclose(JITTED["nearest_neighbor_mixing"](x, mask, 0),
                               np.broadcast_to(mean, x.shape), **TOLERANCE)
    np.testing.assert_allclose(JITTED["adaptive_robust_clipping"](x, mask, 0), x, rtol=1e-6)


def test_krum_family_picks_the_planted_honest_cluster():
    rng = np.random.default_rng(3)
    honest = 1.0 + 0.01 * rng.normal(size=(8, D))
    outliers = 1.0 + 100 * rng.normal(size=(3, D))
    x = np.concatenate([outliers[:2], honest, outliers[2:]]).astype(np.float32)
    is_honest = np.r_[False, False, [True] * 8, False]
    mask = np.ones(N, bool)
    chosen = np.asarray(JITTED["krum"](x, mask, 3))
    assert np.any(np.all(chosen == x[is_honest], axis=1))
    np.testing.assert_allclose(JITTED["multi_krum"](x, mask, 3),      # q = n - f = 8
                               x[is_honest].astype(np.float64).mean(0), **TOLERANCE)
    two_outliers = np.where(np.arange(N)[:, None] == N - 1, x[2], x)  # 9 honest, f = 2
    got = np.asarray(JITTED["bulyan"](two_outliers, mask, 2))
    assert np.all((got >= honest.min(0)) & (got <= honest.max(0)))


@pytest.mark.parametrize("kind", ["gaussian", "ties"])
def test_distance_rules_on_a_stack_of_many_rows_wider_than_one_distance_chunk(kind):
    """40 real rows of 600 coordinates (three 256-column distance chunks, the last zero-padded),
    f = 7: Bulyan's 26 Krum rounds update each row's kept neighbors in place, and its closest-to-
    the-median window grows over 12 values; "ties": integers with eight equal rows, so every
    distance, score and sum is exact and a tie is a true tie."""
    rng = np.random.default_rng(5)
    if kind == "ties":
        x = rng.integers(0, 3, (40, 600)).astype(float)
        x[rng.choice(40, 7, replace=False)] = x[11]
    else:
        x = 0.1 * rng.normal(size=(40, 600))
        x[:6] += 3 * rng.normal(size=600)           # a far group, as Byzantine rows would be
    x = x.astype(np.float32)
    stack, mask = with_garbage(x, garbage_at=(0, 17, 42))
    for name in ["krum_scores", "multi_krum", "bulyan", "nearest_neighbor_mixing"]:
        got = np.asarray(JITTED[name](stack, mask, 7))
        got = got[mask] if CASES[name].rowwise else got
        np.testing.assert_allclose(got, CASES[name].reference(x.astype(np.float64), 7), **TOLERANCE)


def test_krum_ties_go_to_the_lowest_index():
    x = np.arange(4, dtype=np.float32)[:, None]       # scores 5, 2, 2, 5
    mask = np.ones(4, bool)
    assert JITTED["krum"](x, mask, 0) == 1
    assert JITTED["krum"](x[::-1], mask, 0) == 2


def test_geometric_median_of_collinear_points_is_the_middle_point():
    t = np.array([-7.0, -3, -1, 0, 0.5, 2, 4, 9, 20, 30, 100])   # odd count; the middle: 2
    direction = np.array([1.0, -2, 0.5, 3, 1]) / np.sqrt(15.25)
    x = (1.0 + t[:, None] * direction).astype(np.float32)
    stack, mask = with_garbage(x)
    got = jax.jit(lambda x, mask: agg.geometric_median(x, mask, iterations=40))(stack, mask)
    np.testing.assert_allclose(got, 1.0 + 2 * direction, atol=1e-4)


def test_centered_clipping_without_a_threshold_is_the_mean_in_one_step():
    x = real_rows("gaussian")
    stack, mask = with_garbage(x)
    got = jax.jit(lambda x, mask, center: agg.centered_clipping(x, mask, center, tau=jnp.inf))(
        stack, mask, np.full(D, 7.0, np.float32))
    np.testing.assert_allclose(got, x.astype(np.float64).mean(axis=0), **TOLERANCE)


bucketing = jax.jit(agg.bucketing)     # bucket_size traced


def test_buckets_of_one_are_the_real_rows_shuffled():
    x = real_rows("gaussian")
    stack, mask = with_garbage(x)
    outs = [bucketing(stack, mask, jax.random.PRNGKey(seed), 1) for seed in (0, 1)]
    for out, new_mask in outs:
        np.testing.assert_array_equal(new_mask, np.arange(N + 2) < N)
        np.testing.assert_array_equal(out[N:], 0)
        np.testing.assert_array_equal(np.sort(np.asarray(out[:N]), axis=0), np.sort(x, axis=0))
        assert {tuple(row) for row in np.asarray(out[:N])} == {tuple(row) for row in x}
    assert not np.array_equal(outs[0][0], outs[1][0])    # the key draws the permutation


@pytest.mark.parametrize("size", [2, 3, 4, N])
def test_buckets_average_disjoint_groups_of_real_rows(size):
    # one-hot rows: a bucket's mean shows its members as entries 1 / (its size)
    stack, mask = with_garbage(np.eye(N, dtype=np.float32))
    out, new_mask = bucketing(stack, mask, jax.random.PRNGKey(4), size)
    buckets = -(-N // size)
    np.testing.assert_array_equal(new_mask, np.arange(N + 2) < buckets)
    sizes = [min(size, N - b * size) for b in range(buckets)]
    members = np.asarray(out[:buckets]) * np.array(sizes)[:, None]
    np.testing.assert_allclose(members, np.round(members), atol=1e-6)
    np.testing.assert_array_equal(np.round(members).sum(axis=1), sizes)
    np.testing.assert_array_equal(np.round(members).sum(axis=0), np.ones(N))   # each row once
    np.testing.assert_array_equal(out[buckets:], 0)


@pytest.mark.parametrize("m", [1, 2, 3, 7, 16, 25, 33])
def test_the_sorting_network_sorts_columns_as_numpy(m):
    """The median, trimmed mean and Bulyan sort each coordinate by a bitonic network of
    elementwise min and max: it must give numpy's sort exactly, ties and +inf padding included,
    with a nan counted as +inf (jnp.sort's place for it)."""
    rng = np.random.default_rng(m)
    x = rng.standard_normal((m, 5)).astype(np.float32)
    x[rng.random((m, 5)) < 0.3] = 0.25                     # ties
    x[rng.random((m, 5)) < 0.1] = np.nan
    mask = rng.random(m) < 0.8
    expected = np.sort(np.where(mask[:, None] & ~np.isnan(x), x, np.inf), axis=0)
    np.testing.assert_array_equal(agg._sorted_columns(jnp.asarray(x), jnp.asarray(mask)),
                                  expected)
