"""Hyperparameters as traced scalars: every factory builds from tracers without reading them, and
the traced formulas equal the Python-number ones (float64)."""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fljax
from fljax import algorithms
from fljax.algorithms.fedbug import unfreeze_factor
from fljax.algorithms.feddecay import decay_coefficient
from fljax.algorithms.fednova import normalizer
from fljax.runner.config import ALGORITHMS, WRAPPERS
from fljax.data.federated import federate
from fljax.core.engine import init_state, make_round
from fljax.errors import FljaxError
from fljax.models import MLP, from_module, make_model
from fljax.models.heads import with_projection_head
from fljax.models.mixture import mixture

# ------------------------------------------------------------------------------------------------
# every factory traces with tracers for its numbers

# The local optimizer's numbers (and the server's lr), traced for every algorithm.
LOCAL = {"lr": 0.05, "lr_decay": 0.99, "momentum": 0.5, "weight_decay": 1e-3, "clip_norm": 10.0,
         "server_lr": 1.0}
# Values for the float hyperparameters that have no number as default.
VALUES = {"feddecay": {"beta": 0.9}, "ditto": {"personal_lr": 0.02},
          "pfedme": {"inner_lr": 0.02}, "gradual_unfreezing": {"fraction": 0.5},
          "local_decay": {"beta": 0.8}, "relaxed_init": {"beta": 0.1}, "byzantine": {"z": 1.0},
          "dp": {"clip_norm": 1.0, "noise_multiplier": 0.5, "target_quantile": 0.5,
                 "count_noise": 1.0}}
FULL_BATCH = ("fedsgd", "lbsgd")
UNITS = [["fc1"], ["fc2"]]


def float_hyperparameters(name: str) -> dict[str, float]:
    """{name: value} of each argument after the first of factory ``name`` (an algorithm or a
    wrapper) that its annotation lets be a float: from VALUES, LOCAL, else its default."""
    parameters = list(inspect.signature(getattr(algorithms, name)).parameters.values())[1:]
    return {p.name: VALUES.get(name, {}).get(p.name, LOCAL.get(p.name, p.default))
            for p in parameters if "float" in [t.strip() for t in str(p.annotation).split("|")]}


def problem(name: str):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(60, 4, 4, 1)).astype(np.float32)
    y = rng.integers(0, 5, 60)
    sizes = [8, 15, 12, 25]
    data = federate(x, y, np.split(rng.permutation(60), np.cumsum(sizes)[:-1]), 5)
    if name == "fedbn":
        return make_model("mlp_bn", (4, 4, 1), 5), data
    model = from_module("tiny", MLP(hidden=(8,), num_classes=5), (4, 4, 1), 5)
    if name == "moon":
        model = with_projection_head(model, out_dim=4)
    if name == "fedem":
        model = mixture(model, 3)
    return model, data


def build(name: str, values: dict, model) -> algorithms.Algorithm:
    """Algorithm ``name`` (or SCAFFOLD under wrapper ``name``) from ``values``: LOCAL's numbers
    and each float hyperparameter, Python numbers or arrays."""
    factory = getattr(algorithms, name)
    own = {k: values[k] for k in float_hyperparameters(name)}
    if name in FULL_BATCH:
        return factory(values["lr"], **own)
    local = algorithms.local_sgd(values["lr"], round_decay=values["lr_decay"],
                                 momentum=values["momentum"], weight_decay=values["weight_decay"],
                                 clip_norm=values["clip_norm"])
    if name == "dp":          # privatizes a model-sized uplink only (SCAFFOLD's is refused)
        return factory(algorithms.fedavg(local, optax.sgd(values["server_lr"])), cohort_size=2,
                       **own)
    if name in ("robust", "byzantine"):      # a model-sized uplink only, likewise
        structural = {"robust": dict(rule="centered_clipping"),
                      "byzantine": dict(attack="gaussian", count=1)}[name]
        return factory(algorithms.fedavg(local, optax.sgd(values["server_lr"])), **own,
                       **structural)
    if name in WRAPPERS:
        leading = {"gradual_unfreezing": [UNITS],
                   "fedbn": [jax.eval_shape(model.init, jax.random.key(0))]}.get(name, [])
        structural = {"compress": dict(compressor="top_k", ratio=0.5, error_feedback=True)}
        return factory(algorithms.scaffold(local, server_lr=values["server_lr"]), *leading, **own,
                       **structural.get(name, {}))
    extras = {"model": model, "server_optimizer": optax.sgd(values["server_lr"])}
    accepted = inspect.signature(factory).parameters
    return factory(local, **{k: v for k, v in extras.items() if k in accepted}, **own)


def switch_build(values: dict, model) -> algorithms.Algorithm:
    local = algorithms.local_sgd(values["lr"], momentum=values["momentum"])
    first = algorithms.feddyn(local, alpha=values["alpha"])
    return algorithms.switch(first, algorithms.fedavg(local), values["at_round"])


def round_output(builder, values: dict, model, data, full_batch: bool):
    """The state and metrics after one round of ``builder(values)`` from its initial state."""
    alg = builder(values, model)
    round_fn = make_round(alg, model, data, clients_per_round=2,
                          batch_size=None if full_batch else 8,
                          local_steps=1 if full_batch else None,
                          local_epochs=None if full_batch else 1)
    return round_fn(init_state(alg, model.init(jax.random.PRNGKey(0)), data.num_clients, 0))


def arrays(values: dict) -> dict:
    return {k: jnp.asarray(v, jnp.int32 if isinstance(v, int) else jnp.float32)
            for k, v in values.items()}


CASES = list(ALGORITHMS) + list(WRAPPERS) + ["switch"]


@pytest.mark.parametrize("name", CASES)
def test_every_factory_builds_a_round_from_traced_hyperparameters(name):
    """make_jaxpr of a round of the algorithm built from tracers (each float hyperparameter and the
    local and server numbers): a factory that reads a tracer (float(), math.isfinite, an ``if``)
    fails here. The round's outputs have the shapes and dtypes of the float build's."""
    model, data = problem(name)
    if name == "switch":
        builder, values = switch_build, {**LOCAL, "alpha": 0.01, "at_round": 2}
    else:
        builder, values = (lambda v, m: build(name, v, m)), {**LOCAL,
                                                              **float_hyperparameters(name)}
    full_batch = name in FULL_BATCH
    _, shape = jax.make_jaxpr(lambda v: round_output(builder, v, model, data, full_batch),
                              return_shape=True)(arrays(values))
    expected = jax.eval_shape(lambda: round_output(builder, values, model, data, full_batch))
    assert (jax.tree.map(lambda s: (s.shape, s.dtype), shape)
            == jax.tree.map(lambda s: (s.shape, s.dtype), expected))


def test_traced_names_and_concrete_shortcuts():
    """Names that show a number give the Python-number text as before and 'traced' for a tracer;
    a concrete array takes the shortcuts of its value."""
    base = fljax.fedavg(fljax.local_sgd(0.1))
    units = UNITS
    assert fljax.gradual_unfreezing(base, units, 0.5).name == "fedavg+fedbug_bottom_up0.5"
    assert fljax.gradual_unfreezing(base, units, 1).name == "fedavg+fedbug_bottom_up1"
    assert fljax.switch(base, base, 3).name == "fedavg->fedavg@3"
    seen = []

    def record(fraction, at_round, beta):
        seen.extend([fljax.gradual_unfreezing(base, units, fraction).name,
                     fljax.switch(base, base, at_round).name,
                     fljax.local_decay(base, beta).client_tx is base.client_tx])

    jax.make_jaxpr(record)(jnp.float32(0.5), jnp.int32(3), jnp.float32(1.0))
    assert seen == ["fedavg+fedbug_bottom_uptraced", "fedavg->fedavg@traced", False]
    # beta = 1 (exponential) is the algorithm itself for a concrete array as for a float
    assert fljax.local_decay(base, jnp.asarray(1.0)).client_tx is base.client_tx


# ------------------------------------------------------------------------------------------------
# the traced formulas equal the Python-number ones (float64)

def test_fedbug_factor_of_a_traced_fraction_equals_the_python_table():
    fractions = np.concatenate([np.linspace(0.0, 1.0, 201), [0.7, 0.3, 1 / 3, 2 / 3, 0.15, 0.45]])
    max_steps, units = 60, (1, 2, 3, 4, 5, 7)
    steps = np.arange(max_steps + 1, dtype=np.int32)
    table = np.array([[[int(p * k // m) for k in steps] for p in fractions] for m in units])

    def factors(p, k):
        over_k = jax.vmap(lambda kk: jnp.stack(
            [unfreeze_factor(p, kk, m, max_steps) for m in units]), out_axes=1)
        return over_k(k)

    with jax.enable_x64(True):
        traced = jax.jit(jax.vmap(factors, (0, None), 1))(jnp.asarray(fractions), steps)
        assert traced.dtype == jnp.int32
        np.testing.assert_array_equal(traced, table)
    # float32: exact wherever the fraction and its products are float32 numbers (j / 64)
    sixty_fourths = np.arange(65) / 64
    traced = jax.jit(jax.vmap(factors, (0, None), 1))(jnp.asarray(sixty_fourths, jnp.float32),
                                                        steps)
    np.testing.assert_array_equal(traced, np.array(
        [[[int(p * k // m) for k in steps] for p in sixty_fourths] for m in units]))


@pytest.mark.parametrize("schedule", ["exponential", "linear", "linear_code"])
def test_feddecay_schedule_of_a_traced_beta_equals_the_float_one(schedule):
    betas = np.linspace(0.0, 1.0, 11)
    j = jnp.arange(12)
    with jax.enable_x64(True):
        traced = jax.jit(jax.vmap(lambda b: decay_coefficient(b, schedule, j)))(jnp.asarray(betas))
        expected = np.stack([decay_coefficient(float(b), schedule, j) for b in betas])
        assert traced.dtype == jnp.float64
        np.testing.assert_allclose(traced, expected, rtol=1e-15, atol=0)


SERVERS = {
    "fedadam": lambda n: algorithms.fedadam_server(n["lr"], n["b1"], n["b2"], n["tau"], n["v0"]),
    "fedyogi": lambda n: algorithms.fedyogi_server(n["lr"], n["b1"], n["b2"], n["tau"], n["v0"]),
    "fedadagrad": lambda n: algorithms.fedadagrad_server(n["lr"], n["b1"], n["tau"], n["v0"]),
    "heavy_ball": lambda n: algorithms.server_optimizers.heavy_ball_server(n["lr"], n["b1"]),
    "ema": lambda n: algorithms.server_optimizers.ema_momentum_server(n["lr"], n["b1"]),
}
NUMBERS = [{"lr": 1.0, "b1": 0.9, "b2": 0.99, "tau": 1e-3, "v0": 0.0},
           {"lr": 0.3, "b1": 0.0, "b2": 0.5, "tau": 0.1, "v0": 1e-6},
           {"lr": 2.0, "b1": 0.5, "b2": 0.9, "tau": 1e-2, "v0": 1e-4}]


def small_tree(seed):
    rng = np.random.default_rng(seed)
    return {"w": jnp.asarray(rng.normal(size=(3, 2))), "b": jnp.asarray(rng.normal(size=(2,)))}


def run_server(server, params, grads):
    state = server.init(params)
    for g in grads:
        updates, state = server.update(g, state, params)
        params = optax.apply_updates(params, updates)
    return params, state


def test_server_optimizers_with_traced_numbers_equal_the_float_ones():
    with jax.enable_x64(True):
        params, grads = small_tree(0), [small_tree(s) for s in (1, 2, 3)]
        stacked = {k: jnp.asarray([n[k] for n in NUMBERS]) for k in NUMBERS[0]}
        traced = jax.jit(jax.vmap(lambda n: {name: run_server(make(n), params, grads)
                                             for name, make in SERVERS.items()}))(stacked)
        for i, numbers in enumerate(NUMBERS):
            for name, make in SERVERS.items():
                expected = run_server(make(numbers), params, grads)
                got = jax.tree.map(lambda a: a[i], traced[name])
                assert jax.tree.map(lambda a: a.dtype, got) == jax.tree.map(lambda a: a.dtype,
                                                                             expected)
                jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-12, atol=0),
                             got, expected)


LOCAL_NUMBERS = [
    dict(learning_rate=0.1, round_decay=0.9, momentum=0.5, weight_decay=1e-2, clip_norm=0.5),
    dict(learning_rate=0.05, round_decay=1.0, momentum=0.0, weight_decay=0.0, clip_norm=100.0),
    dict(learning_rate=0.2, round_decay=0.99, momentum=0.9, weight_decay=0.0, clip_norm=1.0)]


def run_local(local, params, grads, round_index):
    tx = local.chain(round_index)
    state = tx.init(params)
    for g in grads:
        updates, state = tx.update(g, state, params)
        params = optax.apply_updates(params, updates)
    return params


def test_local_sgd_with_traced_numbers_equals_the_float_one():
    """lr, round decay, momentum (0 included: a traced 0 keeps the buffer, buf = g), weight decay
    (0 included) and clip norm, at round 3."""
    with jax.enable_x64(True):
        params, grads = small_tree(0), [small_tree(s) for s in (4, 5, 6, 7)]
        stacked = {k: jnp.asarray([n[k] for n in LOCAL_NUMBERS]) for k in LOCAL_NUMBERS[0]}
        traced = jax.jit(jax.vmap(lambda n, t: run_local(fljax.local_sgd(**n), params, grads, t),
                                  (0, None)))(stacked, jnp.int32(3))
        for i, numbers in enumerate(LOCAL_NUMBERS):
            expected = run_local(fljax.local_sgd(**numbers), params, grads, 3)
            jax.tree.map(lambda a, b: np.testing.assert_allclose(a[i], b, rtol=1e-12, atol=0),
                         traced, expected)


def test_fednova_normalizer_with_traced_momentum_and_mu_equals_the_float_one():
    """Each branch of the official recursion (momentum and mu zero or not) by jnp.where."""
    pairs = [(0.0, 0.0), (0.9, 0.0), (0.0, 0.1), (0.5, 0.01)]
    steps = jnp.arange(8, dtype=jnp.int32)
    with jax.enable_x64(True):
        lr = jnp.float64(0.05)
        traced = jax.jit(jax.vmap(jax.vmap(
            lambda rho, mu, k: normalizer(k, lr, rho, mu, jnp.float64), (None, None, 0)),
            (0, 0, None)))(jnp.asarray([p[0] for p in pairs]), jnp.asarray([p[1] for p in pairs]),
                           steps)
        for i, (rho, mu) in enumerate(pairs):
            expected = [normalizer(k, lr, rho, mu, jnp.float64) for k in range(8)]
            np.testing.assert_allclose(traced[i], expected, rtol=1e-14, atol=0)


def test_switch_at_a_traced_round():
    """Each run of a vmapped round switches at its own round."""
    params = {"w": jnp.ones(2)}
    first = fljax.fedavg(optax.sgd(1.0), optax.sgd(1.0))
    then = fljax.fedavg(optax.sgd(1.0), optax.sgd(3.0))

    def server_step(at_round, round_index):
        alg = fljax.switch(first, then, at_round)
        state = alg.server_init(params)
        return alg.server_update(params, state, (params, params), round_index)[0]["w"][0]

    steps = jax.jit(jax.vmap(server_step, (0, None)))(jnp.asarray([0, 1, 2, 3], jnp.int32),
                                                      jnp.int32(1))
    np.testing.assert_array_equal(steps, [-2.0, -2.0, 0.0, 0.0])   # then: 1 - 3; first: 1 - 1


# ------------------------------------------------------------------------------------------------
# concrete arrays are checked as Python numbers are

@pytest.mark.parametrize("build_bad, message", [
    (lambda: fljax.fedprox(fljax.local_sgd(0.1), mu=jnp.asarray(-1.0)),
     "mu must be >= 0 and finite, got -1"),
    (lambda: fljax.fedadam(fljax.local_sgd(0.1), b1=jnp.asarray(1.0)), "b1 must be in [0, 1)"),
    (lambda: fljax.feddyn(fljax.local_sgd(0.1), alpha=jnp.asarray(np.nan)),
     "alpha must be > 0 and finite, got nan"),
    (lambda: fljax.local_decay(fljax.fedavg(fljax.local_sgd(0.1)), jnp.asarray(1.5)),
     "beta (the local decay) must be in [0, 1], got 1.5"),
    (lambda: fljax.gradual_unfreezing(fljax.fedavg(fljax.local_sgd(0.1)), [["fc1"]],
                                      jnp.asarray(-0.5)), "a number in [0, 1], got -0.5"),
    (lambda: fljax.switch(fljax.fedavg(fljax.local_sgd(0.1)), fljax.fedavg(fljax.local_sgd(0.1)),
                          jnp.asarray(-1)), "at_round must be an integer >= 0, got -1"),
    (lambda: fljax.fednova(fljax.LocalSGD(0.1, momentum=jnp.asarray(1.0))),
     "fednova needs the local momentum in [0, 1)"),
    (lambda: fljax.fedsam(fljax.local_sgd(0.1), rho=jnp.zeros(2)), "rho must be a finite number"),
    (lambda: fljax.fedntd(fljax.local_sgd(0.1), None, tau=True), "tau must be a finite number > 0"),
])
def test_concrete_arrays_are_validated_with_a_one_line_error(build_bad, message):
    with pytest.raises(FljaxError) as error:
        build_bad()
    assert message in str(error.value) and "\n" not in str(error.value)


def test_python_numbers_keep_their_messages():
    local = fljax.local_sgd(0.1)
    for build_bad, message in [
            (lambda: fljax.fedprox(local, mu=-1.0), "mu must be >= 0 and finite, got -1.0"),
            (lambda: fljax.scaffold(local, server_lr=0), "server_lr must be > 0 and finite, got 0"),
            (lambda: fljax.fedcm(local, alpha=1.5), "alpha must be in (0, 1], got 1.5"),
            (lambda: fljax.fedexp(local, eps_decay=0.0), "eps_decay must be in (0, 1], got 0.0"),
            (lambda: fljax.reptile(local, "x"), "meta_step_size must be > 0 and finite, or a "
                                                "schedule of the round, got 'x'"),
            (lambda: fljax.relaxed_init(fljax.fedavg(local), float("inf")),
             "beta must be a finite number (negative values pull the start towards the client's "
             "previous model), got inf"),
            (lambda: fljax.switch(fljax.fedavg(local), fljax.fedavg(local), True),
             "at_round must be an integer >= 0, got True")]:
        with pytest.raises(FljaxError) as error:
            build_bad()
        assert str(error.value) == message
