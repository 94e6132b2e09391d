"""Robust aggregation and Byzantine clients inside the compiled round: the stacked-messages hook
(``Algorithm.aggregate``) against the plain sum, a robust round against its rule applied by hand
to a plain round's messages, attacks as their formulas, sharded, batched and resumed runs, and
bad input in one line."""

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fljax
from fljax.robustness import aggregators
from fljax.algorithms.robust import weighted_sum
from fljax.runner.cli import main
from fljax.runner.config import ExperimentConfig
from fljax.data.federated import federate
from fljax.errors import FljaxError
from fljax.runner.logs import read_log
from fljax.models import make_model
from tests.xla_build import xla_flags

rng = np.random.default_rng(0)
X = rng.normal(size=(160, 4, 4, 1)).astype(np.float32)
Y = rng.integers(0, 5, 160)
SIZES = [8, 30, 12, 25, 5, 40, 20, 20]
DATA = federate(X, Y, np.split(rng.permutation(160), np.cumsum(SIZES)[:-1]), 5)
MODEL = make_model("mlp", (4, 4, 1), 5)
PARAMS = MODEL.init(jax.random.PRNGKey(0))


def one_round(algorithm, participation="uniform", clients=5, chunk=None):
    round_fn = fljax.make_round(algorithm, MODEL, DATA, clients_per_round=clients, batch_size=8,
                                local_steps=3, participation=participation, client_chunk=chunk)
    state, metrics = round_fn(round_fn.init_state(PARAMS, 0))
    return jax.device_get(state.params), jax.device_get(metrics)


def flat(tree):
    return np.concatenate([np.ravel(a) for a in jax.tree.leaves(tree)]).astype(np.float64)


def summed(cohort):
    return jax.tree.map(lambda rows: rows.sum(axis=0), cohort.messages)


def capture(algorithm, reduce=weighted_sum):
    """``algorithm`` whose round also returns its cohort's stacked messages and mask; ``reduce``:
    the message it hands the server (weighted_sum for unweighted rows: robust's and byzantine's;
    summed for the p_i-weighted rows of a plain algorithm)."""
    def aggregate(cohort):
        return reduce(cohort), {"rows": cohort.messages, "joined": cohort.joined,
                                "weights": cohort.weights}
    return algorithm._replace(aggregate=aggregate)


FEDAVG = fljax.fedavg(fljax.local_sgd(0.1))


@pytest.mark.parametrize("participation,chunk", [("uniform", 5), ("uniform", 1),
                                                 ("bernoulli", 4)])
def test_the_stacked_hook_summing_equals_the_plain_round(participation, chunk):
    plain, _ = one_round(FEDAVG, participation, chunk=chunk)
    hooked, metrics = one_round(capture(FEDAVG, summed), participation, chunk=chunk)
    np.testing.assert_allclose(flat(hooked), flat(plain), rtol=0, atol=1e-6)
    slots = 5 if participation == "uniform" else len(SIZES)
    assert np.shape(metrics["joined"]) == (slots,)
    rows = np.asarray(jax.tree.leaves(metrics["rows"])[0])
    assert rows.shape[0] == slots and not np.any(rows[~np.asarray(metrics["joined"])])


def median_reference(rows, joined):
    return np.median(rows[joined], axis=0)


def krum_reference(rows, joined, f):
    """Blanchard et al. 2017: score(i) = sum of squared distances to its n-f-2 nearest."""
    x = rows[joined]
    n = len(x)
    d = ((x[:, None] - x[None]) ** 2).sum(-1)
    scores = [np.sort(np.delete(d[i], i))[:n - f - 2].sum() for i in range(n)]
    return x[int(np.argmin(scores))]


def by(function, *args, **named):
    """A rule of fljax.robustness.aggregators (float64-tested in test_aggregators.py) on captured rows."""
    return lambda r, j, w: np.asarray(function(jnp.asarray(r, jnp.float32), jnp.asarray(j),
                                               *args, **named), np.float64)


@pytest.mark.parametrize("args,reference", [
    (dict(rule="median"), lambda r, j, w: median_reference(r, j)),
    (dict(rule="krum", f=1), lambda r, j, w: krum_reference(r, j, 1)),
    (dict(rule="trimmed_mean", f=1), lambda r, j, w: np.sort(r[j], axis=0)[1:-1].mean(axis=0)),
    (dict(rule="multi_krum", f=1, q=2), by(aggregators.multi_krum, 1, 2)),
    (dict(rule="bulyan", f=0), by(aggregators.bulyan, 0)),
    (dict(rule="geometric_median"), lambda r, j, w: by(
        aggregators.geometric_median, jnp.asarray(w, jnp.float32), iterations=16)(r, j, w)),
    (dict(rule="centered_clipping", tau=0.05, iterations=2), lambda r, j, w: by(
        aggregators.centered_clipping, jnp.zeros(r.shape[1]), tau=0.05, iterations=2)(r, j, w)),
    (dict(rule="median", pre="nnm", f=1), lambda r, j, w: median_reference(np.asarray(
        aggregators.nearest_neighbor_mixing(jnp.asarray(r, jnp.float32), jnp.asarray(j), 1)[0],
        np.float64), j))])
def test_a_robust_round_is_its_rule_applied_to_a_plain_rounds_messages(args, reference):
    """FedAvg's server steps w <- w - v: v must be the rule over the unweighted updates that the
    plain round's clients sent (the same keys, so the same local training)."""
    _, metrics = one_round(capture(fljax.robust(FEDAVG, "mean")))
    rows = np.stack([flat(jax.tree.map(lambda a: a[i], metrics["rows"]))
                     for i in range(5)])
    joined = np.asarray(metrics["joined"])
    robust_params, _ = one_round(fljax.robust(FEDAVG, **args))
    expected = flat(PARAMS) - reference(rows, joined, np.asarray(metrics["weights"]))
    np.testing.assert_allclose(flat(robust_params), expected, rtol=0, atol=2e-6)


def test_robust_mean_is_the_plain_round_and_bernoulli_masks_are_ignored():
    for participation in ("uniform", "bernoulli"):
        plain, _ = one_round(FEDAVG, participation)
        mean, _ = one_round(fljax.robust(FEDAVG, "mean"), participation)
        np.testing.assert_allclose(flat(mean), flat(plain), rtol=0, atol=1e-6)
    _, metrics = one_round(capture(fljax.robust(FEDAVG, "mean")), "bernoulli")
    joined = np.asarray(metrics["joined"])
    rows = np.stack([flat(jax.tree.map(lambda a: a[i], metrics["rows"]))
                     for i in range(len(SIZES))])
    median, _ = one_round(fljax.robust(FEDAVG, "median"), "bernoulli")
    np.testing.assert_allclose(flat(median), flat(PARAMS) - median_reference(rows, joined),
                               rtol=0, atol=2e-6)


@pytest.mark.parametrize("error_feedback", [False, True])
def test_robust_rules_see_the_decoded_compressed_updates(error_feedback):
    """compress outside robust (the config's order): the median is taken over what the server
    decodes, the clients' compressed unweighted updates."""
    def compressed(algorithm):
        return fljax.compress(algorithm, "qsgd", levels=4, error_feedback=error_feedback)
    _, metrics = one_round(compressed(capture(fljax.robust(FEDAVG, "mean"))))
    rows = np.stack([flat(jax.tree.map(lambda a: a[i], metrics["rows"])) for i in range(5)])
    plain_rows = np.stack([flat(jax.tree.map(lambda a: a[i], one_round(capture(
        fljax.robust(FEDAVG, "mean")))[1]["rows"])) for i in range(5)])
    assert np.abs(rows - plain_rows).max() > 1e-4          # the rows are the quantized ones
    median, _ = one_round(compressed(fljax.robust(FEDAVG, "median")))
    np.testing.assert_allclose(flat(median), flat(PARAMS) - median_reference(
        rows, np.asarray(metrics["joined"])), rtol=0, atol=2e-6)


def test_byzantine_rows_are_replaced_and_counted():
    """IPM's rows are -epsilon times the honest mean; the median then sees them; the round logs
    how many Byzantine clients it sampled."""
    attacked = fljax.byzantine(capture(fljax.robust(FEDAVG, "mean")), "ipm", ids=[0, 1, 2, 3],
                               epsilon=0.5)
    _, honest = one_round(capture(fljax.robust(FEDAVG, "mean")))
    _, metrics = one_round(attacked)
    rows = np.stack([flat(jax.tree.map(lambda a: a[i], honest["rows"])) for i in range(5)])
    got = np.stack([flat(jax.tree.map(lambda a: a[i], metrics["rows"])) for i in range(5)])
    changed = np.any(np.abs(got - rows) > 1e-7, axis=1)
    assert metrics["byzantine_sampled"] == changed.sum() > 0
    honest_mean = rows[~changed].mean(axis=0)
    np.testing.assert_allclose(got[changed], np.broadcast_to(-0.5 * honest_mean,
                                                             got[changed].shape), atol=1e-6)


def test_mimic_copies_the_lowest_id_honest_client_of_the_round():
    _, honest = one_round(capture(fljax.robust(FEDAVG, "mean")))
    _, metrics = one_round(fljax.byzantine(capture(fljax.robust(FEDAVG, "mean")), "mimic",
                                           ids=[0, 1, 2, 3]))
    rows = np.stack([flat(jax.tree.map(lambda a: a[i], honest["rows"])) for i in range(5)])
    got = np.stack([flat(jax.tree.map(lambda a: a[i], metrics["rows"])) for i in range(5)])
    ids = np.asarray(jax.device_get(fljax.make_round(
        capture(FEDAVG), MODEL, DATA, clients_per_round=5, batch_size=8, local_steps=3)(
        fljax.make_round(capture(FEDAVG), MODEL, DATA, clients_per_round=5, batch_size=8,
                         local_steps=3).init_state(PARAMS, 0))[1]["clients"]))
    bad = ids <= 3
    assert bad.any() and (~bad).any()
    target = rows[np.argmin(np.where(bad, np.iinfo(np.int32).max, ids))]
    np.testing.assert_array_equal(got[bad], np.broadcast_to(target, got[bad].shape))
    np.testing.assert_array_equal(got[~bad], rows[~bad])


def test_mimic_warmup_chooses_its_target_as_the_papers_code_does():
    """Karimireddy et al.'s MimicVariantAttacker in float64, from the rows of each round: over
    the first T rounds the running mean mu and direction z (one power-iteration step a round from
    the random start), the target the honest client of largest <u_i, z>; then that client."""
    warmup, rounds, seed = 2, 4, 3
    algorithm = fljax.byzantine(capture(fljax.robust(FEDAVG, "mean")), "mimic", ids=[0, 1, 2],
                                seed=seed, mimic_warmup=warmup)
    round_fn = fljax.make_round(algorithm, MODEL, DATA, clients_per_round=8, batch_size=8,
                                local_steps=3)
    state = round_fn.init_state(PARAMS, 0)
    z = np.asarray(jax.random.normal(jax.random.fold_in(jax.random.PRNGKey(seed), 1),
                                     flat(PARAMS).shape), np.float64)
    np.testing.assert_array_equal(flat(state.server_state.z), z)
    mu, targets = np.zeros_like(z), []
    for t in range(rounds):
        state, metrics = round_fn(state)
        rows = np.stack([flat(jax.tree.map(lambda a: a[i], metrics["rows"])) for i in range(8)])
        ids = np.asarray(metrics["clients"])
        bad = ids <= 2
        if t < warmup:
            a = t / (t + 1)
            mu = a * mu + (1 - a) * rows[~bad].mean(axis=0)
            c = sum(np.dot(u - mu, z) * (u - mu) for u in rows[~bad])
            z = a * z + (1 - a) * c / np.linalg.norm(c)
            z /= np.linalg.norm(z)
            scores = np.where(bad, -np.inf, rows @ z)
            assert np.sort(scores)[-1] - np.sort(scores)[-2] > 1e-6    # a clear argmax
            target = ids[np.argmax(scores)]
        targets.append(int(metrics["mimic_target"]))
        assert targets[-1] == target and metrics["byzantine_sampled"] == 3
        np.testing.assert_array_equal(rows[bad], np.broadcast_to(rows[ids == target],
                                                                 rows[bad].shape))
    np.testing.assert_allclose(flat(state.server_state.z), z, atol=1e-5)
    np.testing.assert_allclose(flat(state.server_state.mu), mu, atol=1e-6)
    assert int(state.server_state.seen) == rounds and len(set(targets[warmup - 1:])) == 1


def test_bad_compositions_and_values_are_one_line():
    for make, said in [
            (lambda: fljax.robust(fljax.scaffold(fljax.local_sgd(0.1)), "median"),
             "needs one model-sized update per client"),
            (lambda: fljax.robust(FEDAVG, "mode"), "rule must be one of"),
            (lambda: fljax.robust(fljax.robust(FEDAVG), "median"), "aggregates its cohort"),
            (lambda: fljax.byzantine(FEDAVG, "ipm", count=1, fraction=0.1), "exactly one of"),
            (lambda: fljax.byzantine(FEDAVG, "ipm", count=1, mimic_warmup=1),
             "mimic_warmup is for attack 'mimic'"),
            (lambda: fljax.byzantine(FEDAVG, "mimic", count=1, mimic_warmup=-1),
             "mimic_warmup must be a whole number >= 0"),
            (lambda: fljax.switch(fljax.robust(FEDAVG), FEDAVG, 3), "wrap the switch")]:
        with pytest.raises(FljaxError, match=said) as raised:
            one_round(make())
        assert "\n" not in str(raised.value)


CLI = ["--dataset", "tests.own_work:blobs", "--model", "tests.own_work:tiny_net",
       "--num-clients", "10", "--clients-per-round", "5", "--local-steps", "2", "--batch-size",
       "8", "--lr", "0.1", "--eval-every", "2", "--checkpoint-every", "2", "--quiet"]
WRAPPED = {"robust": {"rule": "centered_clipping", "tau": 0.5, "pre": "nnm", "f": 1},
           "byzantine": {"attack": "alie", "count": 3}}


def stopped_and_whole(args, tmp_path):
    """The round logs (less wall time) of a run stopped at round 2 and resumed to 4, and of the
    run of 4 rounds that never stopped."""
    half, whole = str(tmp_path / "half"), str(tmp_path / "whole")
    assert main(args + ["--rounds", "2", "--out-dir", half]) == 0
    assert main(args + ["--rounds", "4", "--out-dir", half]) == 0
    assert main(args + ["--rounds", "4", "--out-dir", whole]) == 0
    return [[{k: v for k, v in r.items() if k != "time_s"}
             for r in read_log(os.path.join(d, "metrics.jsonl"))] for d in (half, whole)]


def test_cli_resume_is_bit_identical_and_a_grid_over_tau_and_f_is_one_program(tmp_path, capsys):
    args = CLI + ["--wrappers", json.dumps(WRAPPED)]
    logs = stopped_and_whole(args, tmp_path)
    assert logs[0] == logs[1] and all("byzantine_sampled" in r for r in logs[0]
                                      if r["kind"] == "round")
    capsys.readouterr()
    grid = str(tmp_path / "grid")
    assert main(args + ["--rounds", "2", "--out-dir", grid, "--seeds", "0-1",
                        "--set", "wrappers.robust.tau=0.5,2.0",
                        "--set", "wrappers.robust.f=1,2"]) == 0
    assert "8 runs in one program" in capsys.readouterr().out      # tau and f traced
    alone = str(tmp_path / "alone")
    assert main(CLI + ["--wrappers", json.dumps({**WRAPPED, "robust": {
        **WRAPPED["robust"], "tau": 2.0, "f": 2}}), "--rounds", "2", "--seed", "1",
        "--out-dir", alone]) == 0
    batched = read_log(os.path.join(grid, "tau_2.0_f_2", "seed_1", "metrics.jsonl"))
    single = read_log(os.path.join(alone, "metrics.jsonl"))
    assert [r["train_loss"] for r in batched if r["kind"] == "round"] == pytest.approx(
        [r["train_loss"] for r in single if r["kind"] == "round"], abs=1e-6)


def test_cli_resume_inside_the_mimic_warmup_is_bit_identical(tmp_path):
    """The warm-up's state (mu, z, the rounds seen, the target) is in the checkpoint: stopping
    at round 2 of a 3-round warm-up and resuming gives the run that never stopped."""
    args = CLI + ["--wrappers", json.dumps({"robust": {"rule": "median"}, "byzantine": {
        "attack": "mimic", "count": 3, "mimic_warmup": 3}})]
    logs = stopped_and_whole(args, tmp_path)
    assert logs[0] == logs[1]
    assert [r["mimic_target"] >= 0 for r in logs[0] if r["kind"] == "round"] == [True] * 4


SHARDED = textwrap.dedent("""
import jax, numpy as np, fljax
from fljax.data.federated import federate
from fljax.models import make_model
assert len(jax.devices()) == 8
rng = np.random.default_rng(0)
x = rng.normal(size=(320, 4, 4, 1)).astype(np.float32)
y = rng.integers(0, 5, 320)
data = federate(x, y, np.split(rng.permutation(320), 16), 5)
model = make_model("mlp", (4, 4, 1), 5)
alg = fljax.byzantine(fljax.robust(fljax.fedavg(fljax.local_sgd(0.1)), "krum", f=2), "alie",
                      count=4)
out = []
for participation in ("uniform", "bernoulli"):
    for devices in (1, 8):
        round_fn = fljax.make_round(alg, model, data, clients_per_round=8, batch_size=8,
                                    local_steps=2, participation=participation,
                                    num_devices=devices)
        state = round_fn.place(round_fn.init_state(model.init(jax.random.PRNGKey(0)), 0))
        for _ in range(2):
            state, metrics = round_fn(state)
        out.append(np.concatenate([np.ravel(a) for a in jax.tree.leaves(jax.device_get(
            state.params))]))
    print(participation, float(np.max(np.abs(out[-1] - out[-2]))))
    assert np.max(np.abs(out[-1] - out[-2])) < 1e-5
""")


def test_robust_and_byzantine_rounds_sharded_over_8_devices_equal_one_device():
    env = {**os.environ, "XLA_FLAGS": xla_flags(
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8")}
    done = subprocess.run([sys.executable, "-c", SHARDED], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
