"""One property test swept over every algorithm the CLI knows (and a switch between two), each
with probes on."""

import json

import jax
import numpy as np
import pytest

from fljax.runner.config import ALGORITHMS, ExperimentConfig
from fljax.data.federated import federate
from fljax import probes
from fljax.core.engine import make_round
from fljax import algorithms
from fljax.runner.experiment import build_algorithm
from fljax.models import MLP, from_module
from fljax.models.heads import with_projection_head
from fljax.models.mixture import mixture


def test_every_config_name_has_a_factory():
    assert all(callable(getattr(algorithms, name, None)) for name in ALGORITHMS)


def build(config):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(120, 4, 4, 1)).astype(np.float32)
    y = rng.integers(0, 5, 120)
    sizes = [8, 30, 12, 25, 5, 40]
    data = federate(x, y, np.split(rng.permutation(120), np.cumsum(sizes)[:-1]), 5)
    model = from_module("tiny", MLP(hidden=(16,), num_classes=5), (4, 4, 1), 5)
    if "moon" in (config.algorithm, config.switch_to):
        model = with_projection_head(model, out_dim=8)
    if config.algorithm == "fedem":
        model = mixture(model, 3)
    alg = build_algorithm(config, model)
    round_fn = make_round(alg, model, data, clients_per_round=3, batch_size=8,
                          local_epochs=1, aggregation=config.resolved().aggregation,
                          probes=[probes.pseudo_gradient_diversity(), probes.cosine_previous()])
    return round_fn, model, alg


def train(round_fn, model, rounds=3):
    state = round_fn.init_state(model.init(jax.random.PRNGKey(0)), seed=1)
    shapes = jax.tree.map(lambda a: (a.shape, a.dtype), state)
    history = []
    for _ in range(rounds):
        state, metrics = round_fn(state)
        history.append(float(metrics["train_loss"]))
    # Probes compose with every algorithm: finite once a client has something to compare.
    assert np.isfinite(float(metrics["pseudo_gradient_diversity"]))
    return jax.device_get(state), shapes, history


REQUIRED_ARGS = {"feddecay": {"beta": 0.9}}
ALL_WRAPPERS = {"gradual_unfreezing": {"fraction": 0.5}, "local_decay": {"beta": 0.8},
                "relaxed_init": {"beta": 0.1}}
CONFIGS = [ExperimentConfig(algorithm=name, lr=0.05).replace(
    algorithm_args=REQUIRED_ARGS.get(name, {})) for name in ALGORITHMS] + [
    ExperimentConfig(algorithm="feddyn", switch_to="fedavg", switch_at=2, lr=0.05),
    ExperimentConfig(algorithm="scaffold", lr=0.05, wrappers=json.dumps(ALL_WRAPPERS)),
    ExperimentConfig(algorithm="feddyn", switch_to="fedavg", switch_at=2, lr=0.05,
                     wrappers=json.dumps({"relaxed_init": {"beta": 0.1}})),
    ExperimentConfig(algorithm="feddyn", switch_to="feddyn", switch_at=2, lr=0.05,
                     switch_args=json.dumps({"server_correction": False}),
                     switch_carry_state=True),
    ExperimentConfig(algorithm="ditto", lr=0.05, wrappers=json.dumps(
        {"local_decay": {"beta": 0.8}, "relaxed_init": {"beta": 0.1}})),
    ExperimentConfig(algorithm="scaffold", algorithm_args=json.dumps({"option": "GA"}), lr=0.05,
                     wrappers=json.dumps({"local_decay": {"beta": 0.8, "shrink": True}}))]


@pytest.mark.parametrize("config", CONFIGS,
                         ids=[c.algorithm + (f"->{c.switch_to}" if c.switch_to else "")
                              + ("+" + "+".join(json.loads(c.wrappers)) if c.wrappers != "{}"
                                 else "") for c in CONFIGS])
def test_finite_stable_deterministic_and_compiled_once(config):
    round_fn, model, alg = build(config)
    state, shapes, history = train(round_fn, model)
    assert jax.tree.map(lambda a: (a.shape, a.dtype), state) == shapes
    assert all(np.isfinite(h) for h in history)
    assert all(np.all(np.isfinite(leaf)) for leaf in jax.tree.leaves(state))
    again, _, history_again = train(round_fn, model)     # the same program from the same start
    assert round_fn.compilations() == 1
    assert history == history_again
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(again)):
        np.testing.assert_array_equal(a, b)
    models = alg.eval_models(state.params, state.server_state)
    assert next(iter(models)) in ("global",)
    if alg.personal_model is not None:   # a client's own model: shaped like the global one
        own = alg.personal_model(state.params, state.server_state,
                                 jax.tree.map(lambda a: a[0], state.client_states))
        assert jax.tree.map(np.shape, own) == jax.tree.map(np.shape, state.params)
    assert int(state.round) == 3
