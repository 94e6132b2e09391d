"""The optional hooks: a first exchange summed over the cohort (cohort_start), per-client metrics
averaged over the cohort, the count of exchanges per round; through switch too."""

import jax
import jax.numpy as jnp
import numpy as np

from fljax.algorithms import fedavg, local_sgd, switch
from fljax.runner.config import ExperimentConfig
from fljax.data.federated import federate
from fljax.core.engine import cohort_weights, init_state, make_round, round_key, sample_cohort
from fljax.models import MLP, from_module
from fljax.runner.train import run

SIZES = [8, 30, 12, 25, 5, 40]


def setup():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(120, 4, 4, 1)).astype(np.float32)
    y = rng.integers(0, 5, 120)
    data = federate(x, y, np.split(rng.permutation(120), np.cumsum(SIZES)[:-1]), 5)
    return data, from_module("tiny", MLP(hidden=(16,), num_classes=5), (4, 4, 1), 5)


def with_hooks(base):
    """FedAvg whose clients first send p_i * n_i, and report what came back, their own n_i and
    their own message divided by p_i (n_i again)."""
    def cohort_start(ctx):
        return ctx.weight * ctx.num_examples

    def client_metrics(ctx, start, end):
        return {"cohort_mean_n": ctx.cohort_message, "n": ctx.num_examples.astype(jnp.float32),
                "own_n": ctx.own_message / ctx.weight}

    return base._replace(cohort_start=cohort_start, client_metrics=client_metrics,
                         exchanges=lambda t: 2)


def expected(state, round_index, cohort_size=3):
    sample_key, _ = round_key(state.key, round_index)
    cohort = np.asarray(sample_cohort(sample_key, len(SIZES), cohort_size))
    counts = np.asarray(SIZES)[cohort]
    weights = np.asarray(cohort_weights(jnp.asarray(counts), "examples", jnp.float32))
    return float(np.sum(weights * counts)), float(np.mean(counts))


def test_cohort_message_is_the_sum_of_first_messages_own_message_and_cohort_mean_metrics():
    data, model = setup()
    algorithm = with_hooks(fedavg(local_sgd(0.1)))
    for chunk in (1, 3):
        round_fn = make_round(algorithm, model, data, clients_per_round=3, batch_size=8,
                              local_steps=2, client_chunk=chunk)
        state = init_state(algorithm, model.init(jax.random.PRNGKey(0)), len(SIZES), seed=4)
        for t in range(3):
            want_message, want_n = expected(state, t)
            state, metrics = round_fn(state)
            np.testing.assert_allclose(metrics["cohort_mean_n"], want_message, rtol=1e-6)
            np.testing.assert_allclose(metrics["n"], want_n, rtol=1e-6)
            np.testing.assert_allclose(metrics["own_n"], want_n, rtol=1e-6)


def test_switch_carries_the_hooks_of_the_running_algorithm():
    data, model = setup()
    hooked = with_hooks(fedavg(local_sgd(0.1)))
    plain = fedavg(local_sgd(0.1))
    for algorithm, hooked_rounds in [(switch(hooked, plain, 2), {0, 1}),
                                     (switch(plain, hooked, 2), {2, 3})]:
        round_fn = make_round(algorithm, model, data, clients_per_round=3, batch_size=8,
                              local_steps=2)
        state = init_state(algorithm, model.init(jax.random.PRNGKey(0)), len(SIZES), seed=4)
        for t in range(4):
            want_message, want_n = expected(state, t)
            state, metrics = round_fn(state)
            if t in hooked_rounds:
                np.testing.assert_allclose(metrics["cohort_mean_n"], want_message, rtol=1e-6)
            else:
                assert float(metrics["cohort_mean_n"]) == 0.0
        assert [algorithm.exchanges(t) for t in range(4)] == [2 if t in hooked_rounds else 1
                                                              for t in range(4)]
        assert round_fn.compilations() == 1


def test_runner_logs_exchanges_and_client_metrics(tmp_path):
    import json

    from fljax.runner.experiment import build

    config = ExperimentConfig(rounds=3, eval_every=3, out_dir=str(tmp_path / "run"),
                              num_clients=6, clients_per_round=3)
    experiment = build(config)
    algorithm = with_hooks(experiment.algorithm)
    experiment = build(config, algorithm)
    run(config, progress=False, experiment=experiment)
    with open(tmp_path / "run" / "metrics.jsonl") as f:
        records = [json.loads(line) for line in f]
    rounds = [r for r in records if r["kind"] == "round"]
    assert [r["communication_rounds"] for r in rounds] == [2, 4, 6]
    assert all(r["n"] > 0 and r["cohort_mean_n"] > 0 for r in rounds)
    assert [r["communication_rounds"] for r in records if r["kind"] == "eval"] == [6]
