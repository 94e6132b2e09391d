"""Byzantine attacks against their formulas, computed in float64 NumPy on the honest rows."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fljax.robustness import attacks
from tests import experiment_script

MASK = np.array([1, 1, 1, 0, 1, 1, 0, 1, 1], bool)
BYZANTINE = np.array([0, 1, 0, 1, 0, 1, 0, 0, 1], bool)   # slot 3: padding, not a client
HONEST = MASK & ~BYZANTINE


def stack(garbage=False):
    x = np.random.default_rng(0).normal(size=(MASK.size, 6)).astype(np.float32)
    if garbage:
        x[~MASK] = np.array([np.nan, np.inf, -np.inf, 1e30, -1e30, 7.0], np.float32)
    return x


def honest_mean(x):
    return x[HONEST].astype(np.float64).mean(0)


def alie_reference(x, z, ddof):
    honest = x[HONEST].astype(np.float64)
    return honest.mean(0) - z * honest.std(0, ddof=ddof)


N, F = int(MASK.sum()), int((MASK & BYZANTINE).sum())
KEY = jax.random.key(3)

# name: (attack with traced scalar parameters, float64 reference of the Byzantine rows [m, d])
CASES = {
    "sign_flip": (lambda x, m, b: attacks.sign_flip(x, m, b),
                  lambda x: np.broadcast_to(-honest_mean(x), x.shape)),
    "sign_flip_own": (lambda x, m, b: attacks.sign_flip(x, m, b, own=True),
                      lambda x: -x.astype(np.float64)),
    "gaussian": (lambda x, m, b: attacks.gaussian(x, m, b, KEY, jnp.float32(2.0)), None),
    "alie": (lambda x, m, b: attacks.alie(x, m, b),
             lambda x: np.broadcast_to(alie_reference(x, attacks.alie_z(N, F), 0), x.shape)),
    "alie_sample_std_given_z": (lambda x, m, b: attacks.alie(x, m, b, z=jnp.float32(-1.5), ddof=1),
                                lambda x: np.broadcast_to(alie_reference(x, -1.5, 1), x.shape)),
    "ipm": (lambda x, m, b: attacks.inner_product_manipulation(x, m, b, jnp.float32(0.1)),
            lambda x: np.broadcast_to(-0.1 * honest_mean(x), x.shape)),
    "mimic_first": (lambda x, m, b: attacks.mimic(x, m, b),
                    lambda x: np.broadcast_to(x[np.flatnonzero(HONEST)[0]], x.shape)),
    "mimic_third": (lambda x, m, b: attacks.mimic(x, m, b, jnp.int32(2)),
                    lambda x: np.broadcast_to(x[np.flatnonzero(HONEST)[2]], x.shape)),
    "mimic_clipped": (lambda x, m, b: attacks.mimic(x, m, b, jnp.int32(99)),
                      lambda x: np.broadcast_to(x[np.flatnonzero(HONEST)[-1]], x.shape)),
}


@pytest.mark.parametrize("name", CASES)
def test_attack_matches_formula_and_leaves_other_rows(name):
    attack, reference = CASES[name]
    run = jax.jit(attack)
    x, dirty = stack(), stack(garbage=True)
    out = np.asarray(run(x, MASK, BYZANTINE))
    out_dirty = np.asarray(run(dirty, MASK, BYZANTINE))
    replaced = MASK & BYZANTINE
    np.testing.assert_array_equal(out[~replaced], x[~replaced])           # honest and padding
    np.testing.assert_array_equal(out_dirty[~replaced], dirty[~replaced])
    np.testing.assert_array_equal(out_dirty[replaced], out[replaced])     # padding never enters
    assert np.isfinite(out[replaced]).all()
    if reference is not None:
        np.testing.assert_allclose(out[replaced], reference(x)[replaced], rtol=1e-5, atol=1e-6)


def inverse_normal_cdf(p):
    """Phi^{-1}(p) by bisection on Phi(z) = (1 + erf(z / sqrt 2)) / 2."""
    low, high = -40.0, 40.0
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if (1 + math.erf(mid / math.sqrt(2))) / 2 < p else (low, mid)
    return (low + high) / 2


@pytest.mark.parametrize("n, f, supporters", [(50, 24, 2), (25, 5, 8)])
def test_alie_z_matches_the_papers_formula(n, f, supporters):
    assert math.floor(n / 2 + 1) - f == supporters
    expected = inverse_normal_cdf((n - f - supporters) / (n - f))
    assert attacks.alie_z(n, f) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("n, f", [(50, 24), (25, 5), (10, 6), (2, 1), (3, 1)])
def test_alie_traced_n_and_f_equal_static(n, f):
    """n and f counted in the graph from the masks, or f passed traced, give ``alie_z(n, f)``."""
    slots, d = 56, 4
    x = np.random.default_rng(n + f).normal(size=(slots, d)).astype(np.float32)
    mask = np.arange(slots) < n
    byzantine = np.arange(slots) < f
    honest = x[mask & ~byzantine].astype(np.float64)
    expected = honest.mean(0) - attacks.alie_z(n, f) * honest.std(0)
    counted = jax.jit(attacks.alie)(x, mask, byzantine)
    given = jax.jit(lambda x, f: attacks.alie(x, mask, byzantine, num_byzantine=f))(x, f)
    for out in (counted, given):
        np.testing.assert_allclose(np.asarray(out)[:f], np.broadcast_to(expected, (f, d)),
                                   rtol=1e-5, atol=1e-5)
    if (n, f) in [(10, 6), (2, 1)]:   # no finite z: the honest mean
        assert attacks.alie_z(n, f) == 0.0


def test_ipm_with_zero_epsilon_sends_zeros():
    out = jax.jit(attacks.inner_product_manipulation)(stack(), MASK, BYZANTINE, 0.0)
    np.testing.assert_array_equal(np.asarray(out)[MASK & BYZANTINE], 0.0)


def test_gaussian_rows_have_mean_zero_std_sigma_and_differ():
    slots, d, sigma = 4, 40_000, 3.0
    byzantine = np.array([1, 1, 1, 0], bool)
    out = np.asarray(jax.jit(attacks.gaussian)(
        np.zeros((slots, d), np.float32), np.ones(slots, bool), byzantine, KEY, sigma))
    rows = out[byzantine].astype(np.float64)
    np.testing.assert_allclose(rows.mean(1), 0.0, atol=5 * sigma / math.sqrt(d))
    np.testing.assert_allclose(rows.std(1), sigma, rtol=0.02)
    assert np.abs(np.corrcoef(rows)[np.triu_indices(3, 1)]).max() < 0.03   # independent rows
    again = jax.jit(attacks.gaussian)(np.zeros((slots, d), np.float32), np.ones(slots, bool),
                                      byzantine, KEY, sigma)
    np.testing.assert_array_equal(np.asarray(again), out)


def test_attacks_vmap_over_runs():
    """A batch of runs (stacks, masks, parameters) equals each run alone."""
    runs = 3
    xs = np.random.default_rng(1).normal(size=(runs, MASK.size, 5)).astype(np.float32)
    masks = np.stack([MASK, np.ones_like(MASK), MASK & (np.arange(MASK.size) != 0)])
    epsilons = np.array([0.1, 2.0, 10.0], np.float32)
    zs = np.array([0.5, 1.0, -1.5], np.float32)

    def round_(x, mask, epsilon, z, key):
        return (attacks.inner_product_manipulation(x, mask, BYZANTINE, epsilon),
                attacks.alie(x, mask, BYZANTINE, z), attacks.alie(x, mask, BYZANTINE),
                attacks.gaussian(x, mask, BYZANTINE, key, epsilon),
                attacks.mimic(x, mask, BYZANTINE, 1))

    keys = jax.random.split(KEY, runs)
    batched = jax.jit(jax.vmap(round_))(xs, masks, epsilons, zs, keys)
    alone = jax.jit(round_)
    for r in range(runs):
        for b, a in zip(batched, alone(xs[r], masks[r], epsilons[r], zs[r], keys[r])):
            np.testing.assert_allclose(np.asarray(b[r]), np.asarray(a), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("num_classes", [2, 10])
def test_flip_labels_is_an_involution(num_classes):
    y = jnp.arange(num_classes, dtype=jnp.int32)
    flipped = attacks.flip_labels(y, num_classes)
    np.testing.assert_array_equal(np.asarray(flipped), num_classes - 1 - np.arange(num_classes))
    assert flipped.dtype == y.dtype
    np.testing.assert_array_equal(np.asarray(attacks.flip_labels(flipped, num_classes)), y)


@pytest.mark.parametrize("num_clients, count", [(10, 0), (10, 3), (10, 10), (100, 30)])
def test_byzantine_ids_has_count_clients_and_is_seeded(num_clients, count):
    ids = attacks.byzantine_ids(jax.random.key(0), num_clients, count)
    assert ids.shape == (num_clients,) and ids.dtype == jnp.bool_
    assert int(ids.sum()) == count
    np.testing.assert_array_equal(ids, attacks.byzantine_ids(jax.random.key(0), num_clients, count))
    if (num_clients, count) == (100, 30):
        assert (attacks.byzantine_ids(jax.random.key(1), num_clients, count) != ids).any()


def test_byzantine_ids_refuses_more_than_the_population():
    with pytest.raises(ValueError, match="Byzantine"):
        attacks.byzantine_ids(jax.random.key(0), 5, 6)


# experiments/byzantine_alie_mechanism.py: its fixed Byzantine set and its gradient formula

def load_mechanism():
    return experiment_script.load("byzantine_alie_mechanism")


def test_alie_mechanism_uses_the_wrappers_byzantine_clients_and_the_true_gradient():
    mechanism = load_mechanism()
    drawn = attacks.byzantine_ids(jax.random.PRNGKey(24), 25, 5)   # the json's count 5, seed 24
    assert tuple(np.flatnonzero(np.asarray(drawn))) == mechanism.BYZANTINE
    x = np.random.default_rng(1).uniform(size=(60, 784))
    y = np.arange(60) % 10
    rows = mechanism.one_class_gradients(x, y, np.random.default_rng(2), clients=3, batch=4)
    rng = np.random.default_rng(2)                  # the same draws: the classes, then each batch
    perm = rng.permutation(10)
    for c in range(3):
        idx = rng.choice(np.flatnonzero(y == perm[c % 10]), 4, replace=False)
        assert set(y[idx]) == {perm[c]}             # one class per client
        loss = lambda w: -jnp.mean(jax.nn.log_softmax(x[idx] @ w)[np.arange(4), y[idx]])
        expected = jax.grad(loss)(jnp.zeros((784, 10), jnp.float32))
        np.testing.assert_allclose(rows[c], np.asarray(expected).ravel(), atol=1e-6)
