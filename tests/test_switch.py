"""switch(first, then, at_round): reductions and equivalence to running the two in sequence."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fljax import FljaxError, algorithms
from fljax.algorithms.switch import switch
from fljax.data.federated import federate
from fljax.core.engine import init_state, make_round
from tests.test_fedavg_reference import NUM_CLASSES, tiny_problem


def counting(alg):
    """``alg`` plus a per-client participation counter and a server round counter (stateful)."""

    def client_init(params):
        return {"inner": alg.client_init(params), "visits": jnp.zeros((), jnp.int32)}

    def client_end(ctx, start, end):
        inner, message = alg.client_end(ctx._replace(client_state=ctx.client_state["inner"]),
                                        start, end)
        return {"inner": inner, "visits": ctx.client_state["visits"] + 1}, message

    def server_init(params):
        return {"inner": alg.server_init(params), "updates": jnp.zeros((), jnp.int32)}

    def server_update(params, state, message, round_index):
        params, inner = alg.server_update(params, state["inner"], message, round_index)
        return params, {"inner": inner, "updates": state["updates"] + 1}

    def unwrap(f):
        return lambda ctx, *a: f(ctx._replace(server_state=ctx.server_state["inner"],
                                              client_state=ctx.client_state["inner"]), *a)

    return alg._replace(client_init=client_init, client_end=client_end, server_init=server_init,
                        server_update=server_update, client_tx=unwrap(alg.client_tx),
                        client_start=unwrap(alg.client_start),
                        client_loss=unwrap(alg.client_loss))


FIRST = counting(algorithms.fedavg(algorithms.local_sgd(0.3, momentum=0.5),
                                   optax.sgd(1.0, momentum=0.9)))
THEN = algorithms.fedavg(algorithms.local_sgd(0.1, weight_decay=0.01), optax.sgd(0.8))


def run(alg, params, rounds, state=None):
    x, y, parts, model = tiny_problem()
    round_fn = make_round(alg, model, federate(x, y, parts, NUM_CLASSES), clients_per_round=3,
                          batch_size=4, local_epochs=1)
    state = state or init_state(alg, params, len(parts), seed=7)
    for _ in range(rounds):
        state, _ = round_fn(state)
    return jax.device_get(state), round_fn


def initial_params():
    model = tiny_problem()[3]
    return jax.tree.map(lambda a: np.asarray(a, np.float64), model.init(jax.random.PRNGKey(0)))


@pytest.mark.parametrize("at_round, same_as", [(0, "then"), (4, "first"), (9, "first")])
def test_switch_at_0_is_then_and_at_T_is_first(at_round, same_as):
    with jax.enable_x64(True):
        switched, round_fn = run(switch(FIRST, THEN, at_round), initial_params(), 4)
        plain, _ = run(FIRST if same_as == "first" else THEN, initial_params(), 4)
    assert round_fn.compilations() == 1
    for a, b in zip(jax.tree.leaves(switched.params), jax.tree.leaves(plain.params)):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-14)


def test_switch_midway_is_first_then_second_from_first_model():
    with jax.enable_x64(True):
        switched, round_fn = run(switch(FIRST, THEN, 2), initial_params(), 5)
        # Reference: 2 rounds of FIRST, then THEN from FIRST's model, same round numbers and key.
        first_state, _ = run(FIRST, initial_params(), 2)
        then_state = init_state(THEN, first_state.params, 6, seed=7)._replace(
            round=jnp.asarray(2, jnp.int32))
        then_state, _ = run(THEN, None, 3, state=then_state)
    assert round_fn.compilations() == 1
    for a, b in zip(jax.tree.leaves(switched.params), jax.tree.leaves(then_state.params)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-13)
    (s1, s2), (c1, _) = switched.server_state, switched.client_states
    assert int(s1["state"]["updates"]) == 2 and int(np.asarray(c1["visits"]).sum()) == 2 * 3
    assert int(s2["rounds_done"]) == 5


def test_eval_models_follow_the_active_algorithm():
    marked = THEN._replace(eval_models=lambda p, s: {"global": p, "then_only": p})
    alg = switch(FIRST, marked, 2)
    with jax.enable_x64(True):
        state, _ = run(alg, initial_params(), 2)
        assert list(alg.eval_models(state.params, state.server_state)) == ["global"]
        state, _ = run(alg, None, 1, state=state)
        assert list(alg.eval_models(state.params, state.server_state)) == ["global", "then_only"]


def test_bad_switch_round():
    with pytest.raises(FljaxError, match="at_round must be an integer >= 0, got -1"):
        switch(FIRST, THEN, -1)


# FedDyn -> a FedDyn variant that keeps h_k (feddyn-as-initialization Figure 12).
DYN_LOCAL = dict(lr=0.3, lr_decay=0.9, momentum=0.0, weight_decay=1e-2, clip=0.5)
DYN_SCHED = dict(batch=4, local_steps=None, local_epochs=1, aggregation="uniform")


@pytest.mark.parametrize("variant", ["server_correction", "client_regularization"])
def test_carry_state_continues_feddyn_h_into_the_variant(variant):
    """switch(FedDyn, FedDyn w/o h (or w/o Reg), 2, carry_state=True) equals the float64 official-
    code reference that runs FedDyn for rounds 0-1 and the variant for rounds 2-3 with the SAME
    h_k and H; without carry_state the variant restarts from h_k = 0 and ends elsewhere."""
    from tests.test_drift_corrections import (assert_close, client_row, feddyn_reference,
                                              make_local, run as run_dyn)
    local, alpha, at = make_local(**DYN_LOCAL), 0.3, 2
    first = algorithms.feddyn(local, alpha=alpha)
    then = algorithms.feddyn(local, alpha=alpha, **{variant: False})
    with jax.enable_x64(True):
        carried = switch(first, then, at, carry_state=True)
        params, state, x, y, parts = run_dyn(carried, **DYN_SCHED, rounds=4)
        _, reset, *_ = run_dyn(switch(first, then, at), **DYN_SCHED, rounds=4)
    flags = dict(client_regularization=True, server_correction=True)
    flags[variant] = lambda t: t < at
    theta, gamma, hs = feddyn_reference(params, x, y, parts, alpha=alpha, adaptive_alpha=True,
                                        **flags, **DYN_LOCAL, **DYN_SCHED, rounds=4)
    assert_close(state.params, theta)
    (s1, s2), (c1, c2) = state.server_state, state.client_states
    assert s2["state"] == () and c2 == ()
    for cid, h in enumerate(hs):
        assert_close(client_row(c1, cid), h)
    assert_close(s1["state"].h_mean, jax.tree.map(lambda *a: sum(a) / len(hs), *hs))
    assert_close(carried.eval_models(state.params, state.server_state)["gamma"], gamma)
    assert max(float(np.max(np.abs(a - b))) for a, b in zip(
        jax.tree.leaves(reset.params), jax.tree.leaves(theta))) > 1e-3


def test_carry_state_needs_states_of_the_same_structure():
    alg = switch(algorithms.feddyn(algorithms.local_sgd(0.1)),
                 algorithms.scaffold(algorithms.local_sgd(0.1)), 2, carry_state=True)
    with pytest.raises(FljaxError, match="same server state"):
        init_state(alg, initial_params(), 6, seed=0)
    alg = switch(algorithms.feddyn(algorithms.local_sgd(0.1)), THEN, 2, carry_state=True)
    with pytest.raises(FljaxError, match="'feddyn' and 'fedavg' to have the same client state"):
        init_state(alg, initial_params(), 6, seed=0)


def test_config_switch_carry_state_reaches_the_switch():
    from fljax.runner.config import ExperimentConfig
    from fljax.runner.experiment import build_algorithm
    from fljax.models import make_model
    model = make_model("mlp", (64,), 10)
    for carry in (False, True):
        config = ExperimentConfig(algorithm="feddyn", switch_to="feddyn", switch_at=2,
                                  switch_args='{"server_correction": false}',
                                  switch_carry_state=carry).validate()
        alg = build_algorithm(config, model)
        state = init_state(alg, model.init(jax.random.PRNGKey(0)), 4, seed=0)
        assert (state.client_states[1] == ()) == carry


def test_config_switch_lr_is_the_local_lr_of_the_second_algorithm():
    """--switch-lr 0.01 after --lr 0.1 (feddyn-as-init Figure 7's x0.1 step at the switch) is
    switch(feddyn at lr 0.1, fedavg at lr 0.01), inside the one compiled round, as a float or a
    traced value; without it the second algorithm keeps --lr."""
    from fljax.runner.config import ExperimentConfig
    from fljax.runner.experiment import build_algorithm, make_algorithm
    model = tiny_problem()[3]
    config = ExperimentConfig(algorithm="feddyn", switch_to="fedavg", switch_at=2, lr=0.1,
                              switch_lr=0.01).validate()
    reference = switch(make_algorithm("feddyn", {}, config, model),
                       make_algorithm("fedavg", {}, config.replace(lr=0.01), model), 2)
    with jax.enable_x64(True):
        expected, _ = run(reference, initial_params(), 4)
        for values in (None, {"switch_lr": jnp.asarray(0.01)}):
            got, _ = run(build_algorithm(config, model, values=values), initial_params(), 4)
            for a, b in zip(jax.tree.leaves(got.params), jax.tree.leaves(expected.params)):
                np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-14)
        kept, _ = run(build_algorithm(config.replace(switch_lr=None), model), initial_params(), 4)
    assert not np.allclose(jax.tree.leaves(kept.params)[0], jax.tree.leaves(expected.params)[0])


@pytest.mark.parametrize("change, message", [
    (dict(switch_lr=0.0), "switch_lr must be > 0 and finite, or unset, got 0.0"),
    (dict(switch_lr=0.01, switch_to=None), "switch_lr needs switch_to"),
])
def test_bad_switch_lr_is_one_line(change, message):
    from fljax.runner.config import ExperimentConfig
    with pytest.raises(FljaxError, match=message):
        ExperimentConfig(switch_to="fedavg", switch_at=2).replace(**change).validate()
