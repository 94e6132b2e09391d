"""The public Python API as a new user meets it: top-level names, reusable initial parameters,
working defaults, and any Flax module as a model."""

import dataclasses
import pydoc
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fljax
from fljax import algorithms
from fljax.runner.config import ALGORITHMS, WRAPPERS
from fljax.fielddocs import document_fields


@pytest.fixture(scope="module")
def digits():
    ds = fljax.load_dataset("digits")
    parts = fljax.data.dirichlet(ds.y_train, 8, 0.5, seed=0, min_size=10)
    return ds, fljax.federate(ds.x_train, ds.y_train, parts, ds.num_classes)


def test_every_algorithm_and_wrapper_is_a_top_level_name():
    for name in (*ALGORITHMS, *WRAPPERS, "switch"):
        assert getattr(fljax, name) is getattr(algorithms, name), name
        assert name in fljax.__all__


@pytest.mark.parametrize("cls", [fljax.ClientContext, fljax.Algorithm, fljax.RoundState,
                                 fljax.ExperimentConfig], ids=lambda cls: cls.__name__)
def test_help_gives_every_field_its_meaning(cls):
    text = pydoc.render_doc(cls, renderer=pydoc.plaintext)
    flat = " ".join(" ".join(re.sub(r"^ \|", "", line) for line in text.splitlines()).split())
    assert "Alias for field number" not in text
    if dataclasses.is_dataclass(cls):
        meanings = {f.name: f.metadata["help"] for f in dataclasses.fields(cls)}
    else:
        meanings = {name: getattr(cls, name).__doc__ for name in cls._fields}
    for name, meaning in meanings.items():
        assert meaning and " ".join(meaning.split()) in flat, name


def test_a_field_without_its_meaning_is_refused():
    with pytest.raises(TypeError, match=r"fields without a text \['weight'\]"):
        document_fields(fljax.ClientContext, {name: "x" for name in fljax.ClientContext._fields
                                              if name != "weight"})


def test_two_algorithms_start_from_the_same_initial_params(digits):
    """The round donates its state; init_state copies, so the caller's params stay usable."""
    ds, data = digits
    model = fljax.make_model("mlp", ds.x_train.shape[1:], ds.num_classes)
    params = model.init(jax.random.PRNGKey(0))
    before = jax.tree.map(np.array, params)
    finals = {}
    for name, alg in {"fedavg": fljax.fedavg(fljax.local_sgd(0.05)),
                      "fedprox": fljax.fedprox(fljax.local_sgd(0.05), mu=0.0)}.items():
        round_fn = fljax.make_round(alg, model, data, clients_per_round=4, batch_size=16,
                                    local_steps=3)
        state = fljax.init_state(alg, params, data.num_clients, seed=0)
        for _ in range(2):
            state, _ = round_fn(state)
        finals[name] = jax.device_get(state.params)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(before), strict=True):
        np.testing.assert_array_equal(np.asarray(a), b)          # still alive and unchanged
    # FedProx with mu = 0 is FedAvg: both runs really started from the same model.
    for a, b in zip(jax.tree.leaves(finals["fedavg"]), jax.tree.leaves(finals["fedprox"])):
        np.testing.assert_array_equal(a, b)


def test_feddyn_official_default_runs_without_client_sizes(digits):
    ds, data = digits
    model = fljax.make_model("mlp", ds.x_train.shape[1:], ds.num_classes)
    alg = fljax.feddyn(fljax.local_sgd(0.05), alpha=0.1)       # adaptive alpha, as the code
    round_fn = fljax.make_round(alg, model, data, clients_per_round=4, batch_size=16,
                                local_steps=3)
    state = fljax.init_state(alg, model.init(jax.random.PRNGKey(0)), data.num_clients, seed=0)
    state, metrics = round_fn(state)
    assert np.isfinite(float(metrics["train_loss"]))
    assert any(np.abs(leaf).sum() > 0 for leaf in jax.tree.leaves(state.client_states))


class PlainMLP(nn.Module):
    """A module as a Flax tutorial writes it: no train flag, no features."""

    @nn.compact
    def __call__(self, x):
        x = x.reshape(x.shape[0], -1)
        return nn.Dense(10)(nn.relu(nn.Dense(32)(x)))


class DropoutMLP(nn.Module):
    """Dropout switched by ``deterministic``, parameters in float64."""

    @nn.compact
    def __call__(self, x, deterministic: bool = True):
        x = x.reshape(x.shape[0], -1)
        x = nn.relu(nn.Dense(32, param_dtype=jnp.float64)(x))
        x = nn.Dropout(0.5)(x, deterministic=deterministic)
        return nn.Dense(10, param_dtype=jnp.float64)(x)


def train(model, data, rounds=6):
    alg = fljax.fedavg(fljax.local_sgd(0.1))
    round_fn = fljax.make_round(alg, model, data, clients_per_round=4, batch_size=16,
                                local_epochs=1)
    state = fljax.init_state(alg, model.init(jax.random.PRNGKey(0)), data.num_clients, seed=0)
    losses = []
    for _ in range(rounds):
        state, metrics = round_fn(state)
        losses.append(float(metrics["train_loss"]))
    return state, losses


def test_a_plain_flax_module_trains(digits):
    ds, data = digits
    model = fljax.from_module("plain", PlainMLP(), ds.x_train.shape[1:])
    params = model.init(jax.random.PRNGKey(0))
    assert model.num_classes == 10
    # Groups run from input to output (FedBug unfreezes them in this order).
    assert [params[g]["kernel"].shape for g in model.groups] == [(64, 32), (32, 10)]
    state, losses = train(model, data)
    assert losses[-1] < 0.7 * losses[0]
    acc = fljax.make_evaluator(model, ds.x_test, ds.y_test)(state.params)["accuracy"]
    assert float(acc) > 0.5
    with pytest.raises(fljax.FljaxError, match="with_features"):
        model.apply_with_features(state.params, ds.x_test[:2])


def test_a_float64_module_with_dropout_keeps_its_dtype(digits):
    ds, _ = digits
    with jax.enable_x64(True):
        parts = fljax.data.dirichlet(ds.y_train, 8, 0.5, seed=0, min_size=10)
        data = fljax.federate(ds.x_train, ds.y_train, parts, ds.num_classes)
        model = fljax.from_module("dropout64", DropoutMLP(), ds.x_train.shape[1:])
        state, losses = train(model, data, rounds=3)
        x = jnp.asarray(ds.x_test[:4], jnp.float32)
        eval_a = model.apply(state.params, x)
        train_a = model.apply(state.params, x, train=True, rng=jax.random.PRNGKey(1))
    assert all(leaf.dtype == np.float64 for leaf in jax.tree.leaves(state.params))
    assert eval_a.dtype == np.float64              # float32 inputs follow the params' dtype
    assert losses[-1] < losses[0]
    assert not np.allclose(eval_a, train_a)        # deterministic=False turns dropout on
