"""The cohort sampler under jax_enable_x64: no dtype warning, and the clients of float32 runs."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fljax.population.cohort import sample_cohort

SEEDS = (0, 1, 7, 123)
SIZES = ((10, 3), (100, 10), (1000, 50), (5, 5), (2**20, 16))


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_x64_draws_the_float32_cohort_without_warnings(jit):
    draw = jax.jit(sample_cohort, static_argnums=(1, 2)) if jit else sample_cohort
    expected = {(seed, n, c): np.asarray(draw(jax.random.PRNGKey(seed), n, c))
                for seed in SEEDS for n, c in SIZES}
    # float32 mode's draws are those of Floyd's sampler as it came in (commit 36cdd3a)
    np.testing.assert_array_equal(expected[0, 100, 10], [0, 28, 39, 42, 44, 46, 50, 51, 69, 70])
    with jax.enable_x64(True):
        with warnings.catch_warnings():
            # int64 written into the int32 ids was a FutureWarning ("will result in an error")
            warnings.simplefilter("error")
            for (seed, n, c), cohort in expected.items():
                ids = draw(jax.random.PRNGKey(seed), n, c)
                assert ids.dtype == jnp.int32
                np.testing.assert_array_equal(ids, cohort, err_msg=f"seed {seed}, N {n}, C {c}")
