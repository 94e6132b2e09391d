"""switch(first, then, at_round): reductions and equivalence to running the two in sequence."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fljax import FljaxError, algorithms
from fljax.algorithms.switch import switch
from fljax.data.federated import federate
from fljax.engine import init_state, make_round
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
