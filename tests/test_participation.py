"""Bernoulli participation (the FedDyn / FedBug / FL-Simulator code): each client joins a round
with probability C; rounds with a varying cohort equal float64 references over the clients who
joined, for a weighted algorithm (FedProx), a stateful one with unweighted messages (FedDyn) and
one with a first exchange (FedGA), sequentially and in vmapped chunks."""

import json

import jax
import numpy as np
import pytest

from fljax.algorithms.fedga import fedga
from fljax.algorithms.fedprox import fedprox
from fljax.runner.config import ExperimentConfig
from fljax.core.engine import bernoulli_cohort, round_key
from fljax.errors import FljaxError
from fljax.runner.train import run as run_experiment
from tests.test_drift_corrections import (EPOCHS, STEPS, assert_close, client_row, feddyn_of,
                                          feddyn_reference, fedprox_reference, make_local,
                                          rounds_of, run, split)
from tests.test_fedavg_reference import SIZES
from tests.test_fedinit_fedga import fedga_reference

BERNOULLI = dict(participation="bernoulli", cohort=3)       # C = 3 / 6
LOCAL = dict(lr=0.3, lr_decay=0.9, momentum=0.5, weight_decay=1e-2, clip=0.5)


def cohort_sizes(sched):
    parts = [np.arange(n) for n in SIZES]
    return [len(clients) for _, clients in rounds_of(parts, **sched)]


def test_bernoulli_cohort_puts_joined_clients_first_and_never_returns_an_empty_round():
    key = jax.random.PRNGKey(0)
    keys = jax.vmap(lambda t: jax.random.fold_in(key, t))(np.arange(400))
    draw = jax.jit(jax.vmap(bernoulli_cohort, in_axes=(0, None, None)), static_argnums=(1, 2))
    all_ids, all_joined = map(np.asarray, draw(keys, 20, 0.25))
    joined_rate = []
    for ids, joined in zip(all_ids, all_joined):
        assert sorted(ids) == list(range(20))
        m = int(joined.sum())
        assert m >= 1 and joined[:m].all() and not joined[m:].any()
        assert list(ids[:m]) == sorted(ids[:m]) and list(ids[m:]) == sorted(ids[m:])
        joined_rate.append(m / 20)
    assert 0.23 <= np.mean(joined_rate) <= 0.27
    rare = np.asarray(draw(keys[:20], 5, 0.01)[1]).sum(axis=1)
    assert rare.min() >= 1                      # redrawn until someone joins (FedDyn's code)
    ids, joined = map(np.asarray, bernoulli_cohort(key, 8, 0.5, num_devices=2))
    flat, flat_joined = map(np.asarray, bernoulli_cohort(key, 8, 0.5))
    np.testing.assert_array_equal(np.sort(ids[joined]), flat[flat_joined])   # the same draw
    for share, share_joined in zip(ids.reshape(2, 4), joined.reshape(2, 4)):  # its own clients,
        assert set(share) == set(range(4 * (share[0] // 4), 4 * (share[0] // 4) + 4))
        m = int(share_joined.sum())                                     # those who joined first
        assert share_joined[:m].all() and not share_joined[m:].any()
        assert list(share[:m]) == sorted(share[:m]) and list(share[m:]) == sorted(share[m:])
    assert sorted(ids[:4]) == [0, 1, 2, 3]


@pytest.mark.parametrize("client_chunk", [1, 2])
def test_fedprox_with_bernoulli_participation_matches_float64_reference(client_chunk):
    sched = dict(**EPOCHS, aggregation="examples", **BERNOULLI)
    assert len(set(cohort_sizes(sched))) > 1                        # the cohort size varies
    with jax.enable_x64(True):
        alg = fedprox(make_local(**LOCAL), mu=0.2)
        params, state, x, y, parts = run(alg, **sched, client_chunk=client_chunk)
    w = fedprox_reference(params, x, y, parts, mu=0.2, server_lr=1.0, **LOCAL, **sched)
    assert_close(state.params, w)


def test_feddyn_with_bernoulli_participation_matches_float64_reference():
    case = dict(**STEPS, lr=0.3, lr_decay=1.0, momentum=0.0, weight_decay=1e-3, clip=0.5,
                aggregation="uniform", alpha=0.3, adaptive_alpha=True,
                client_regularization=True, server_correction=True)
    local, sched, rest = split(case)
    with jax.enable_x64(True):
        params, state, x, y, parts = run(feddyn_of(local, rest), **sched, **BERNOULLI,
                                         client_chunk=3)
    theta, _, hs = feddyn_reference(params, x, y, parts, **local, **sched, **rest, **BERNOULLI)
    assert_close(state.params, theta)
    for cid, h in enumerate(hs):                 # idle clients' h_k untouched
        assert_close(client_row(state.client_states, cid), h)


def test_fedga_with_bernoulli_participation_matches_float64_reference():
    sched = dict(**EPOCHS, aggregation="uniform", **BERNOULLI)
    with jax.enable_x64(True):
        params, state, x, y, parts = run(fedga(make_local(**LOCAL), beta=0.7), **sched)
    assert_close(state.params, fedga_reference(params, x, y, parts, beta=0.7, **LOCAL, **sched))


def test_a_bernoulli_run_logs_the_clients_who_joined(tmp_path):
    config = ExperimentConfig().replace(rounds=3, eval_every=3, local_steps=2, local_epochs=None,
                                        participation="bernoulli", clients_per_round=5,
                                        out_dir=str(tmp_path))
    run_experiment(config, progress=False)
    with open(tmp_path / "metrics.jsonl") as f:
        rounds = [line for line in map(json.loads, f) if line["kind"] == "round"]
    for t, record in enumerate(rounds):
        ids, joined = map(np.asarray, bernoulli_cohort(
            round_key(jax.random.PRNGKey(0), t)[0], 20, 5 / 20))
        assert record["clients"] == sorted(ids[joined].tolist())


def test_unknown_participation_is_rejected():
    with pytest.raises(FljaxError, match="participation must be one of"):
        ExperimentConfig().replace(participation="poisson").validate()
