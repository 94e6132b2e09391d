"""experiments/byzantine_bucketing_krum.py: the bucket Krum picks and its members are what a
float64 brute force over the same bucketing order gives, and the mechanism the script measures
(a pair of an honest update and a sign-flipped row is picked when the honest noise outweighs the
mean, not when the mean dominates) holds on planted rows."""
import jax
import jax.numpy as jnp
import numpy as np

from tests.experiment_script import load


def test_krum_of_buckets_equals_a_float64_brute_force():
    script = load("byzantine_bucketing_krum")
    rows = np.random.default_rng(0).normal(size=(25, 6))
    for seed in range(3):
        key = jax.random.PRNGKey(seed)
        aggregate, members = script.krum_of_buckets(jnp.asarray(rows, jnp.float32), key)
        order = np.asarray(jax.random.permutation(key, 25))
        buckets = [order[b:b + 2] for b in range(0, 25, 2)]                # 12 pairs and a single
        means = np.array([rows[b].mean(0) for b in buckets])
        kept = len(means) - 5 - 2                                           # n - f - 2 neighbours
        scores = [sum(sorted(((means[i] - means[j]) ** 2).sum()
                             for j in range(len(means)) if j != i)[:kept])
                  for i in range(len(means))]
        best = int(np.argmin(scores))
        assert sorted(members[members >= 0].tolist()) == sorted(buckets[best].tolist())
        np.testing.assert_allclose(aggregate, means[best], rtol=1e-5, atol=1e-6)


def test_a_sign_flipped_pair_is_picked_only_when_noise_outweighs_the_mean():
    script = load("byzantine_bucketing_krum")
    byzantine = np.isin(np.arange(25), script.BYZANTINE)
    g = np.zeros(50)
    g[0] = 1.0

    def byzantine_pick_rate(noise):
        rng = np.random.default_rng(1)
        picks = 0
        for seed in range(20):
            rows = g + noise * rng.normal(size=(25, 50)) / np.sqrt(50)     # ||noise_i|| ~ noise
            rows[byzantine] = -rows[~byzantine].mean(0)
            _, members = script.krum_of_buckets(jnp.asarray(rows, jnp.float32),
                                                jax.random.PRNGKey(seed))
            picks += bool(np.isin(np.asarray(members), script.BYZANTINE).any())
        return picks / 20

    assert byzantine_pick_rate(0.2) == 0.0
    assert byzantine_pick_rate(5.0) >= 0.9
