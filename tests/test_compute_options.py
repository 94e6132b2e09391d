"""make_round's compute options: ``unroll`` of the local-step scan (same results, another
program) and ``compute_dtype`` (bfloat16 forward and backward over float32 parameters)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fljax import FljaxError, algorithms

from fljax.runner import experiment
from fljax.runner.config import ExperimentConfig
from fljax.data.federated import federate
from fljax.core.engine import make_round
from fljax.models import make_model


@pytest.fixture(scope="module")
def setup():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(120, 8, 8, 1)).astype(np.float32)
    y = rng.integers(0, 10, 120)
    data = federate(x, y, np.array_split(rng.permutation(120), 6), 10)
    return data, make_model("mlp", (8, 8, 1), 10)


def rounds(setup, alg, count=2, **kwargs):
    """(the state after ``count`` rounds, the round function) of 3-client, 5-step rounds."""
    data, model = setup
    round_fn = make_round(alg, model, data, clients_per_round=3, batch_size=8, local_steps=5,
                          **kwargs)
    state = round_fn.init_state(model.init(jax.random.key(0)), seed=0)
    for _ in range(count):
        state, _ = round_fn(state)
    return jax.device_get(state), round_fn


def leaves(tree):
    return [np.asarray(leaf) for leaf in jax.tree.leaves(tree)]


# Ditto trains its personal model through ClientContext.train: the same unroll applies there.
@pytest.mark.parametrize("alg, unroll", [
    (algorithms.fedavg(algorithms.local_sgd(0.1, momentum=0.5)), 5),   # all 5 local steps
    (algorithms.ditto(algorithms.local_sgd(0.1)), 2)], ids=["fedavg", "ditto"])
def test_unroll_changes_the_program_not_the_results(setup, alg, unroll):
    base, base_fn = rounds(setup, alg, count=1)
    state, round_fn = rounds(setup, alg, count=1, unroll=unroll)
    for a, b in zip(leaves(base), leaves(state), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    start = base_fn.init_state(setup[1].init(jax.random.key(0)), seed=0)
    assert base_fn.lower(start).as_text() != round_fn.lower(start).as_text()


def test_bfloat16_compute_keeps_float32_parameters_and_stays_close(setup):
    alg = algorithms.fedavg(algorithms.local_sgd(0.1, momentum=0.5))
    f32, _ = rounds(setup, alg)
    same, _ = rounds(setup, alg, compute_dtype=jnp.float32)
    bf16, _ = rounds(setup, alg, compute_dtype=jnp.bfloat16)
    assert {leaf.dtype for leaf in leaves(bf16.params) + leaves(bf16.client_states)} == \
        {np.dtype(np.float32)}
    for a, b in zip(leaves(f32), leaves(same), strict=True):
        np.testing.assert_array_equal(a, b)
    f32_params, bf16_params = leaves(f32.params), leaves(bf16.params)
    assert any(not np.array_equal(a, b) for a, b in zip(f32_params, bf16_params))
    for a, b in zip(f32_params, bf16_params):
        np.testing.assert_allclose(a, b, atol=0.02)


@pytest.mark.parametrize("kwargs, message", [
    (dict(unroll=0), "unroll must be an integer >= 1, got 0"),
    (dict(unroll=1.5), "unroll must be an integer >= 1, got 1.5"),
    (dict(compute_dtype="int32"), "compute_dtype must be a floating dtype .* got 'int32'"),
    (dict(compute_dtype="half-ish"), "compute_dtype must be a floating dtype .* got 'half-ish'"),
])
def test_bad_compute_options(setup, kwargs, message):
    data, model = setup
    with pytest.raises(FljaxError, match=message):
        make_round(algorithms.fedavg(algorithms.local_sgd(0.1)), model, data,
                   clients_per_round=3, batch_size=8, local_steps=5, **kwargs)


def test_the_config_passes_both_options_to_the_round(monkeypatch):
    seen = {}

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return make_round(*args, **kwargs)

    monkeypatch.setattr(experiment, "make_round", spy)
    config = ExperimentConfig(num_clients=10, clients_per_round=4, unroll=3,
                              compute_dtype="bfloat16")
    experiment.build(config)
    assert (seen["unroll"], seen["compute_dtype"]) == (3, "bfloat16")
    for bad, message in [(dict(unroll=0), "unroll must be an integer >= 1, got 0"),
                         (dict(compute_dtype="float16"), "compute_dtype must be one of")]:
        with pytest.raises(FljaxError, match=message):
            config.replace(**bad).validate()
