"""FedBug (gradual unfreezing) equals a float64 reference written from the official code's schedule.

The reference trains each sampled client as torch does with frozen parameters: at local step k
(0-based) of K, with f = P * K // M (Python floats), unit j (j >= 1) is frozen while k < j f; a
frozen group gets no gradient, so it is left out of the clip norm, gets no weight decay, no in-loss
term and no momentum, and its momentum buffer starts (buf = d_p) at its first trainable step.
"""


import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fljax.algorithms import fedavg, local_sgd
from fljax.algorithms.base import ClientContext
from fljax.algorithms.fedbug import gradual_unfreezing, unfreeze_factor
from fljax.algorithms.feddyn import feddyn
from fljax.algorithms.fedprox import fedprox
from fljax.errors import FljaxError
from tests import experiment_script
from tests.reference import global_norm, mlp_loss_and_grad, tree_map
from tests.test_drift_corrections import (EPOCHS, REDUCTION_LOCAL, STEPS, assert_close,
                                          assert_equal_to_fedavg, client_row, make_local,
                                          rounds_of, run, split)
from tests.xla_build import in_default_build

UNITS = (("fc1",), ("fc2",))


# ------------------------------------------------------------------------------------------------
# float64 reference

def trainable_groups(k, num_steps, fraction, order, frozen_last):
    """The official code's schedule (utils_gu.py), in Python floats."""
    groups = [unit[0] for unit in UNITS]
    if frozen_last:
        return set(groups[:len(groups) - frozen_last])
    factor = fraction * num_steps // len(groups)
    ranks = range(len(groups)) if order == "bottom_up" else reversed(range(len(groups)))
    return {group for group, rank in zip(groups, ranks) if not k < rank * factor}


def local_train(start, x, y, part, steps, *, lr, momentum, weight_decay, clip, in_loss,
                schedule):
    """torch SGD over the trainable groups only (frozen ones have grad None)."""
    local = tree_map(np.copy, start)
    bufs = {}
    for k, (positions, mask) in enumerate(steps):
        train = schedule(k, len(steps))
        examples = part[np.minimum(positions, len(part) - 1)]
        _, grads = mlp_loss_and_grad(local, x[examples], y[examples], mask)
        g = {group: grads[group] for group in train}
        if in_loss is not None:
            terms = in_loss(local)
            g = {group: tree_map(np.add, g[group], terms[group]) for group in train}
        if clip is not None:
            norm = global_norm(g)
            g = tree_map(lambda a: a * clip / max(norm, clip), g)
        for group in train:
            d = tree_map(lambda a, b: a + weight_decay * b, g[group], local[group])
            bufs[group] = d if group not in bufs else tree_map(
                lambda m, a: momentum * m + a, bufs[group], d)
            local[group] = tree_map(lambda a, b: a - lr * b, local[group], bufs[group])
    return local


def reference(params, x, y, parts, *, base, lr, lr_decay, momentum, weight_decay, clip,
              fraction, order="bottom_up", frozen_last=0, mu=0.0, alpha=0.0, **sched):
    """FedAvg / FedProx (sum_S p_k y_k) or official-code FedDyn (fixed alpha) clients, trained
    with the schedule above."""
    schedule = lambda k, n: trainable_groups(k, n, fraction, order, frozen_last)
    theta = params
    hs = [tree_map(np.zeros_like, params) for _ in parts]
    for t, clients in rounds_of(parts, **sched):
        gamma = tree_map(np.zeros_like, theta)
        for p, cid, steps in clients:
            server, h_k = theta, hs[cid]
            decay, in_loss = weight_decay, None
            if base == "fedprox":
                in_loss = lambda v: tree_map(lambda a, b: mu * (a - b), v, server)
            if base == "feddyn":
                in_loss = lambda v: tree_map(lambda h, s: alpha * (h - s), h_k, server)
                decay = weight_decay + alpha
            local = local_train(theta, x, y, parts[cid], steps, lr=lr * lr_decay ** t,
                                momentum=momentum, weight_decay=decay, clip=clip,
                                in_loss=in_loss, schedule=schedule)
            hs[cid] = tree_map(lambda h, a, b: h + (a - b), h_k, local, server)
            gamma = tree_map(lambda g, a: g + p * a, gamma, local)
        theta = gamma
        if base == "feddyn":
            theta = tree_map(lambda g, *h: g + sum(h) / len(hs), gamma, *hs)
    return theta, hs


def wrapped(base, local, mu=0.0, alpha=0.0):
    if base == "fedavg":
        return fedavg(local)
    if base == "fedprox":
        return fedprox(local, mu=mu)
    return feddyn(local, alpha=alpha, adaptive_alpha=False)


MOMENTUM = dict(lr=0.3, lr_decay=0.9, momentum=0.5, weight_decay=1e-2)
CASES = {
    # EPOCHS: K_i = 4, 2, 6, 2, 4, 2, so f = K_i // 2 at P = 1 and 1, 0, 2, 0, 1, 0 at P = 0.7.
    "fedavg_bottom_up_clip": dict(**EPOCHS, **MOMENTUM, clip=0.5, aggregation="examples",
                                  base="fedavg", fraction=1.0),
    "fedavg_top_down": dict(**EPOCHS, **MOMENTUM, clip=None, aggregation="uniform",
                            base="fedavg", fraction=1.0, order="top_down"),
    "fedavg_frozen_last": dict(**EPOCHS, **MOMENTUM, clip=0.5, aggregation="examples",
                               base="fedavg", fraction=0.0, frozen_last=1),
    "fedprox_clip": dict(**EPOCHS, **MOMENTUM, clip=0.5, aggregation="examples",
                         base="fedprox", fraction=0.7, mu=0.4),
    "feddyn_steps": dict(**STEPS | dict(local_steps=4), **MOMENTUM, clip=None,
                         aggregation="uniform", base="feddyn", fraction=1.0, alpha=0.3),
    # The linear term alpha (h_k - theta) is nonzero on frozen leaves: it must stay out of the
    # clip norm (torch: no .grad, so clip_grad_norm_ leaves it out).
    "feddyn_clip": dict(**STEPS | dict(local_steps=4), **MOMENTUM, clip=0.2,
                        aggregation="uniform", base="feddyn", fraction=1.0, alpha=0.3),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_fedbug_matches_float64_reference(case):
    local, sched, rest = split(CASES[case])
    variant = {k: rest[k] for k in ("order", "frozen_last") if k in rest}
    base = wrapped(rest["base"], make_local(**local), rest.get("mu", 0.0), rest.get("alpha", 0.0))
    with jax.enable_x64(True):
        alg = gradual_unfreezing(base, UNITS, rest["fraction"], **variant)
        params, state, x, y, parts = run(alg, **sched)
    theta, hs = reference(params, x, y, parts, **local, **sched, **rest)
    assert_close(state.params, theta)
    if rest["base"] == "feddyn":
        for cid, h in enumerate(hs):
            assert_close(client_row(state.client_states, cid), h)
    # Freezing mattered: the same run without it ends elsewhere.
    plain, _ = reference(params, x, y, parts, **local, **sched,
                         **rest | dict(fraction=0.0, frozen_last=0))
    assert global_norm(tree_map(np.subtract, plain, theta)) > 1e-3


def test_vmapped_clients_match_the_reference():
    local, sched, rest = split(CASES["fedprox_clip"])
    with jax.enable_x64(True):
        alg = gradual_unfreezing(fedprox(make_local(**local), mu=rest["mu"]), UNITS, 0.7)
        params, state, x, y, parts = run(alg, **sched, client_chunk=3)
    assert_close(state.params, reference(params, x, y, parts, **local, **sched, **rest)[0])


# ------------------------------------------------------------------------------------------------
# reductions and frozen parameters

@pytest.mark.parametrize("fraction", [0.0, 0.25])  # 0.25 * K_i // 2 = 0 for every K_i <= 6
def test_no_freezing_is_the_wrapped_algorithm_bit_for_bit(fraction):
    with jax.enable_x64(True):
        _, state, *_ = run(gradual_unfreezing(fedavg(REDUCTION_LOCAL), UNITS, fraction),
                           **EPOCHS, aggregation="uniform")
    assert_equal_to_fedavg(state.params, "uniform")


def fraction_zero_feddyn_equals_feddyn():
    with jax.enable_x64(True):
        dyn = feddyn(REDUCTION_LOCAL, alpha=0.3)
        _, plain, *_ = run(dyn, **EPOCHS, aggregation="uniform")
        _, gu, *_ = run(gradual_unfreezing(dyn, UNITS, 0.0), **EPOCHS, aggregation="uniform")
    for a, b in zip(jax.tree.leaves((plain.params, plain.client_states)),
                    jax.tree.leaves((gu.params, gu.client_states))):
        np.testing.assert_array_equal(a, b)


def test_fraction_zero_feddyn_is_feddyn_bit_for_bit():
    """In the build users run (at LLVM's level 0, the tests' build, the two programs differ by an
    ulp in float64)."""
    in_default_build(__name__, "fraction_zero_feddyn_equals_feddyn")


def test_fedbabu_head_never_leaves_the_server_value():
    """FedDyn's h_k = y_k,K - theta is exactly 0 on the frozen head: y_k,K == theta bit for bit,
    despite weight decay, momentum, alpha and a nonzero linear term alpha (h_k - theta)."""
    with jax.enable_x64(True):
        alg = gradual_unfreezing(feddyn(REDUCTION_LOCAL, alpha=0.3), UNITS,
                                 0.0, frozen_last=1)
        _, state, *_ = run(alg, **EPOCHS, aggregation="uniform")
    h = state.client_states
    assert all(np.all(leaf == 0.0) for leaf in jax.tree.leaves(h["fc2"]))
    assert global_norm(h["fc1"]) > 1e-3


def test_frozen_leaves_stay_at_the_server_value_step_by_step():
    """The client's optax chain alone: fc2 is frozen for k < f = 1.0 * 6 // 2 = 3 and keeps the
    server's value bit for bit (with a nonzero FedDyn linear term, weight decay and momentum);
    its momentum buffer is still zero when it thaws."""
    rng = np.random.default_rng(0)
    normal = lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)
    params = {"fc1": {"kernel": normal(4, 5)}, "fc2": {"kernel": normal(5)}}
    h = tree_map(lambda a: normal(*a.shape), params)
    ctx = ClientContext(params=params, server_state=None, client_state=h,
                        round=jnp.asarray(0), client_id=jnp.asarray(0), weight=jnp.asarray(1.0),
                        cohort_size=1, num_clients=1, num_examples=jnp.asarray(10),
                        mean_examples=jnp.asarray(10.0),
                        num_steps=jnp.asarray(6), max_steps=6, steps_per_epoch=jnp.asarray(6),
                        full_gradient=None)
    local = local_sgd(0.1, momentum=0.9, weight_decay=1e-2)
    alg = gradual_unfreezing(feddyn(local, alpha=0.3, adaptive_alpha=False), UNITS, 1.0)
    tx = alg.client_tx(ctx)
    y, state = params, tx.init(params)
    for k in range(6):
        grads = tree_map(lambda a: normal(*a.shape), params)
        updates, state = tx.update(grads, state, y)
        y = optax.apply_updates(y, updates)
        trace = state[0][-1][0].trace    # sgd's momentum buffer (the chain's last part)
        if k < 3:
            np.testing.assert_array_equal(y["fc2"]["kernel"], params["fc2"]["kernel"])
            np.testing.assert_array_equal(trace["fc2"]["kernel"], 0.0)
        else:
            assert np.all(y["fc2"]["kernel"] != params["fc2"]["kernel"])
        assert np.all(y["fc1"]["kernel"] != params["fc1"]["kernel"])


def test_unfreeze_factor_is_python_float_floor_division():
    cases = [(0.7, 10, 7), (0.7, 10, 1), (0.9, 10, 3), (0.4, 50, 5), (0.1, 30, 3), (0.29, 100, 1),
             (0.3, 7, 2), (1.0, 1, 2), (0.2, 250, 5), (0.35, 200, 7)]
    for fraction, steps, units in cases:
        got = jax.jit(lambda k: unfreeze_factor(fraction, k, units, 300))(jnp.asarray(steps))
        assert int(got) == int(fraction * steps // units), (fraction, steps, units)
    batched = jax.jit(jax.vmap(lambda k: unfreeze_factor(0.7, k, 7, 40)))(jnp.arange(0, 40))
    np.testing.assert_array_equal(batched, [int(0.7 * k // 7) for k in range(40)])


# ------------------------------------------------------------------------------------------------
# bad input

ALG = fedavg(local_sgd(0.1))
BAD = {
    "negative_fraction": (lambda: gradual_unfreezing(ALG, UNITS, -0.1), r"fraction .* \[0, 1\]"),
    "fraction_above_one": (lambda: gradual_unfreezing(ALG, UNITS, 1.5), r"got 1.5"),
    "nan_fraction": (lambda: gradual_unfreezing(ALG, UNITS, float("nan")), "fraction"),
    "string_fraction": (lambda: gradual_unfreezing(ALG, UNITS, "0.4"), "fraction"),
    "bool_fraction": (lambda: gradual_unfreezing(ALG, UNITS, True), "fraction"),
    "empty_units": (lambda: gradual_unfreezing(ALG, (), 0.4), "units must be a non-empty"),
    "string_units": (lambda: gradual_unfreezing(ALG, "fc1", 0.4), "units must be a non-empty"),
    "empty_unit": (lambda: gradual_unfreezing(ALG, (("fc1",), ()), 0.4), "each unit"),
    "bare_name_unit": (lambda: gradual_unfreezing(ALG, ("fc1", "fc2"), 0.4), "each unit"),
    "repeated_group": (lambda: gradual_unfreezing(ALG, (("fc1",), ("fc1", "fc2")), 0.4),
                       r"\['fc1'\] appear more than once"),
    "unknown_order": (lambda: gradual_unfreezing(ALG, UNITS, 0.4, "sideways"),
                      "order must be one of"),
    "frozen_last_all": (lambda: gradual_unfreezing(ALG, UNITS, 0.0, frozen_last=2),
                        r"frozen_last must be an integer in \[0, 1\]"),
    "frozen_last_negative": (lambda: gradual_unfreezing(ALG, UNITS, 0.0, frozen_last=-1),
                             "frozen_last"),
    "frozen_last_with_fraction": (lambda: gradual_unfreezing(ALG, UNITS, 0.4, frozen_last=1),
                                  "fraction=0"),
    "not_an_algorithm": (lambda: gradual_unfreezing(optax.sgd(0.1), UNITS, 0.4),
                         "wraps an Algorithm"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_rejected(case):
    build, message = BAD[case]
    with pytest.raises(FljaxError, match=message):
        build()


@pytest.mark.parametrize("units, message", [
    ((("fc1",), ("head",)), r"unknown in units: \['head'\], not in any unit: \['fc2'\]"),
    ((("fc1",),), r"not in any unit: \['fc2'\]"),
])
def test_units_are_checked_against_the_model_groups(units, message):
    with pytest.raises(FljaxError, match=message):
        run(gradual_unfreezing(ALG, units, 0.4), **STEPS, aggregation="uniform", rounds=1)


def test_names():
    assert gradual_unfreezing(ALG, UNITS, 0.4).name == "fedavg+fedbug_bottom_up0.4"
    assert gradual_unfreezing(ALG, UNITS, 0.0, frozen_last=1).name == "fedavg+fedbug_frozen_last1"
    assert gradual_unfreezing(ALG, UNITS, 0.4, name="fedbug").name == "fedbug"


# ------------------------------------------------------------------------------------------------
# the theory toy (FedBug (Kao and Wang, 2023) section 4, appendix B.6)

def load_toy():
    return experiment_script.load("fedbug_toy")


def test_toy_fedbug_converges_faster_with_a_smaller_contraction_ratio():
    toy = load_toy()
    fedavg_run = toy.run(0.0, seeds=10)
    fedbug_run = toy.run(0.04, seeds=10)   # v frozen for one local step (Theorem 2's case)
    for rounds in (5, 10, 20, 40):
        assert fedbug_run["loss"][:, rounds].mean() < fedavg_run["loss"][:, rounds].mean()
    assert np.nanmean(fedbug_run["r"]) < np.nanmean(fedavg_run["r"]) < 1.0
    # Both reach the global minimum a = b = 1 / v.
    assert fedavg_run["loss"][:, -1].max() < 1e-4
    assert fedavg_run["d"][:, -1].max() < 1e-2
