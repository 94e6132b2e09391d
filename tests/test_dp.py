"""User-level DP (``fljax.dp``, ``fljax.privacy``): DP-FedAvg with fixed and adaptive clipping
equals a float64 reference written from McMahan et al. 2018 and Andrew et al. 2021 with the same
noise keys; the noise has the stated mean and covariance; epsilon is dp_accounting's, monotone,
and reproduces Abadi et al. 2016's figure; bad input and algorithms that would leak are refused."""

import functools
import json
import math
import os
import re
import subprocess
import sys

import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from dp_accounting import rdp

from fljax import FljaxError, algorithms

from fljax import privacy
from fljax.algorithms.dp import update_noise_multiplier
from fljax.runner import config as config_module
from fljax.runner.cli import main
from fljax.population.cohort import server_key
from fljax.data.federated import federate
from fljax.core.engine import init_state, make_round
from tests.reference import client_schedule, global_norm, local_sgd, mlp_loss_and_grad, tree_map
from tests.test_fedavg_reference import NUM_CLASSES, tiny_problem
from tests.test_bad_input import snapshot
from tests.test_runs import compare

LR, STEPS, BATCH, COHORT = 0.3, 3, 4, 3


def dp_fedavg_reference(params, x, y, parts, *, seed, rounds, participation, clip, z,
                        quantile=None, clip_lr=0.2, count_noise=None):
    """w^{t+1} = w^t - (sum_i clip(Delta_i) + N(0, (z_D C^t)^2)) / m, clip(D) = D min(1, C/||D||);
    adaptive: b~ = 1/2 + (sum_i (b_i - 1/2) + N(0, s_b^2)) / m, C^{t+1} = C^t exp(-eta (b~ - q)),
    z_D = (z^-2 - (2 s_b)^-2)^-1/2. The noise is drawn from fljax's server key of each round."""
    w = tree_map(lambda a: np.asarray(a, np.float64), params)
    counts = np.array([len(p) for p in parts])
    key = jax.random.PRNGKey(seed)
    z_update = z if quantile is None else (z ** -2 - (2 * count_noise) ** -2) ** -0.5
    clips = [clip]
    for t in range(rounds):
        total = tree_map(np.zeros_like, w)
        count = 0.0
        for cid, steps in client_schedule(key, t, COHORT, counts, BATCH, STEPS, None,
                                          counts.max(), participation):
            local = local_sgd(w, steps, parts[cid], x, y, LR)
            delta = tree_map(lambda a, b: a - b, w, local)
            norm = global_norm(delta)
            total = tree_map(lambda s, d: s + d * min(1.0, clip / norm), total, delta)
            count += (norm <= clip) - 0.5
        update_key, count_key = jax.random.split(server_key(key, t))
        leaves, treedef = jax.tree.flatten(total)
        keys = jax.random.split(update_key, len(leaves))
        noise = treedef.unflatten([np.asarray(jax.random.normal(k, leaf.shape, jnp.float64))
                                   for k, leaf in zip(keys, leaves)])
        w = tree_map(lambda a, s, n: a - (s + z_update * clip * n) / COHORT, w, total, noise)
        if quantile is not None:
            noisy = count + count_noise * float(jax.random.normal(count_key, (), jnp.float64))
            clip = clip * math.exp(-clip_lr * (0.5 + noisy / COHORT - quantile))
            clips.append(clip)
    return w, clips


@pytest.mark.parametrize("participation", ["uniform", "bernoulli"])
@pytest.mark.parametrize("adaptive", [False, True], ids=["fixed_clip", "adaptive_clip"])
def test_dp_fedavg_matches_float64_reference(participation, adaptive):
    x, y, parts, model = tiny_problem()
    settings = dict(clip=0.4, z=0.8, quantile=0.5 if adaptive else None,
                    count_noise=1.0 if adaptive else None)
    with jax.enable_x64(True):
        params = jax.tree.map(lambda a: np.asarray(a, np.float64),
                              model.init(jax.random.PRNGKey(1)))
        expected, clips = dp_fedavg_reference(params, x, y, parts, seed=3, rounds=4,
                                              participation=participation, **settings)
        alg = algorithms.dp(algorithms.fedavg(algorithms.local_sgd(LR)), settings["clip"],
                            settings["z"], COHORT, target_quantile=settings["quantile"],
                            count_noise=settings["count_noise"])
        round_fn = make_round(alg, model, federate(x, y, parts, NUM_CLASSES),
                              clients_per_round=COHORT, batch_size=BATCH, local_steps=STEPS,
                              participation=participation)
        state = init_state(alg, params, len(parts), seed=3)
        got_clips = [float(state.server_state.clip_norm)]
        for _ in range(4):
            state, _ = round_fn(state)
            got_clips.append(float(state.server_state.clip_norm))
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(expected)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-13)
    if adaptive:
        np.testing.assert_allclose(got_clips, clips, rtol=1e-12)
        assert len(set(np.round(clips, 9))) == len(clips)        # C moved every round
    else:
        assert got_clips == [0.4] * 5


def test_some_updates_are_clipped_and_some_are_not_in_the_reference_problem():
    """The reference test above exercises both branches of clip(Delta)."""
    x, y, parts, model = tiny_problem()
    counts = np.array([len(p) for p in parts])
    with jax.enable_x64(True):
        w = tree_map(lambda a: np.asarray(a, np.float64), model.init(jax.random.PRNGKey(1)))
        norms = []
        for t in range(2):
            for cid, steps in client_schedule(jax.random.PRNGKey(3), t, COHORT, counts, BATCH,
                                              STEPS, None, counts.max()):
                local = tree_map(np.copy, w)
                for positions, mask in steps:
                    examples = parts[cid][np.minimum(positions, counts[cid] - 1)]
                    _, g = mlp_loss_and_grad(local, x[examples], y[examples], mask)
                    local = tree_map(lambda a, b: a - LR * b, local, g)
                norms.append(global_norm(tree_map(lambda a, b: a - b, w, local)))
    assert min(norms) < 0.4 < max(norms)


def test_the_noise_has_mean_zero_and_covariance_z_c_over_m_squared():
    """perturb's noise over 40,000 server keys in one vmapped program: mean 0 and covariance
    (z_D C / m)^2 I, with z_D from Theorem 1 under adaptive clipping; the count's std s_b."""
    z, clip, m, sigma_b = 1.5, 0.7, 10, 2.0
    summed = ({"a": jnp.zeros((2, 2)), "b": jnp.zeros(3)}, jnp.zeros(()))
    for quantile, z_update in ((None, z), (0.5, update_noise_multiplier(z, sigma_b))):
        alg = algorithms.dp(algorithms.fedavg(algorithms.local_sgd(0.1)), clip, z, m,
                            target_quantile=quantile,
                            count_noise=None if quantile is None else sigma_b)
        state = alg.server_init(summed[0])
        keys = jax.random.split(jax.random.PRNGKey(0), 40_000)
        update, count = jax.jit(jax.vmap(lambda k: alg.perturb(summed, state, k)))(keys)
        flat = np.concatenate([np.asarray(leaf).reshape(len(keys), -1)
                               for leaf in jax.tree.leaves(update)], axis=1)
        std = z_update * clip / m
        assert np.all(np.abs(flat.mean(0)) < 4 * std / np.sqrt(len(keys)))
        cov = np.cov(flat.T) / std ** 2
        np.testing.assert_allclose(np.diag(cov), 1.0, atol=0.03)
        assert np.max(np.abs(cov - np.diag(np.diag(cov)))) < 0.03
        if quantile is None:
            assert np.all(np.asarray(count) == 0)                # no count released
        else:
            assert abs(np.std(np.asarray(count)) / sigma_b - 1) < 0.03
    assert z < update_noise_multiplier(z, sigma_b)               # the count costs update noise


def test_epsilon_is_dp_accountings_for_the_sampling_the_run_uses():
    z, m, n, t, delta = 1.1, 20, 500, 300, 1e-5
    direct = rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    direct.compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.SampledWithoutReplacementDpEvent(n, m, dp_accounting.GaussianDpEvent(z / 2)),
        t))
    assert privacy.epsilon(z, t, delta, cohort_size=m, num_clients=n) == direct.get_epsilon(delta)
    poisson = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(m / n, dp_accounting.GaussianDpEvent(z)), t)
    for name, fresh in (("rdp", rdp.RdpAccountant), ("pld", dp_accounting.pld.PLDAccountant)):
        assert privacy.epsilon(z, t, delta, cohort_size=m, num_clients=n,
                               participation="bernoulli", accountant_name=name) == \
            fresh().compose(poisson).get_epsilon(delta)
    # PLD is tight, RDP an upper bound a little above it.
    pld_eps, rdp_eps = (privacy.epsilon(z, t, delta, cohort_size=m, num_clients=n,
                                        participation="bernoulli", accountant_name=name)
                        for name in ("pld", "rdp"))
    assert pld_eps < rdp_eps < 1.3 * pld_eps


def test_fixed_size_cohorts_are_charged_the_replace_one_sensitivity_2c():
    """With every user in every round (m = N) there is no sampling: the run is T Gaussian
    mechanisms whose sensitivity under replace-one is 2C, RDP alpha (2C)^2 / (2 (zC)^2)."""
    z, n, t, delta = 3.0, 50, 40, 1e-5
    orders = np.array(rdp.rdp_privacy_accountant.DEFAULT_RDP_ORDERS)
    rdp_curve = t * orders * 4 / (2 * z ** 2)
    expected = rdp.rdp_privacy_accountant.compute_epsilon(orders, rdp_curve, delta)[0]
    assert privacy.epsilon(z, t, delta, cohort_size=n, num_clients=n) == pytest.approx(
        expected, rel=1e-9)


def test_epsilon_grows_with_rounds_and_sampling_and_falls_with_noise():
    base = dict(cohort_size=20, num_clients=400, participation="bernoulli")
    eps = lambda z, t, **kw: privacy.epsilon(z, t, 1e-5, **{**base, **kw})
    assert eps(1.0, 0) == 0.0 and eps(0.0, 10) == math.inf
    by_rounds = [eps(1.0, t) for t in (1, 10, 100, 1000)]
    by_q = [eps(1.0, 100, cohort_size=m) for m in (5, 20, 80)]
    by_noise = [eps(z, 100) for z in (0.6, 1.0, 2.0, 4.0)]
    assert by_rounds == sorted(by_rounds) and len(set(by_rounds)) == 4
    assert by_q == sorted(by_q) and len(set(by_q)) == 3
    assert by_noise == sorted(by_noise, reverse=True) and len(set(by_noise)) == 4


def test_abadi_et_al_2016_figure_is_reproduced():
    """Abadi et al. 2016, Section 3.1: q = 0.01, sigma = 4, delta = 1e-5, T = 10,000 steps give
    epsilon ~ 1.26 with the moments accountant (integer orders <= 32, the classic conversion
    epsilon = min_a (RDP(a) + log(1/delta) / (a - 1))). fljax's RDP of that event converted that
    way gives 1.26; its reported epsilon uses dp_accounting's tighter conversion, below it."""
    orders = np.arange(2, 33)
    account = rdp.RdpAccountant(orders=list(orders))
    account.compose(privacy.dp_event(4.0, cohort_size=100, num_clients=10_000,
                                     participation="bernoulli", rounds=10_000))
    classic = np.min(account._rdp + np.log(1e5) / (orders - 1))
    assert round(float(classic), 2) == 1.26
    reported = privacy.epsilon(4.0, 10_000, 1e-5, cohort_size=100, num_clients=10_000,
                               participation="bernoulli")
    assert 1.0 < reported < 1.26


@pytest.mark.parametrize("participation,accountant", [("uniform", "rdp"),
                                                      ("bernoulli", "pld")])
def test_calibration_spends_at_most_the_target_and_no_less_noise_would(participation,
                                                                       accountant):
    settings = dict(cohort_size=10, num_clients=200, participation=participation,
                    accountant_name=accountant)
    z = privacy.calibrate(4.0, 50, 1e-4, **settings)
    assert privacy.epsilon(z, 50, 1e-4, **settings) <= 4.0
    assert privacy.epsilon(0.99 * z, 50, 1e-4, **settings) > 4.0


def test_batched_dp_runs_equal_their_runs_alone():
    """Clip norm, noise multiplier and target quantile traced: each run its own values and noise."""
    build = lambda h: algorithms.dp(algorithms.fedprox(algorithms.local_sgd(0.2), mu=0.1),
                                    h["clip"], h["z"], 3, target_quantile=h["q"], count_noise=1.0)
    compare(build, {"clip": [0.3, 1.0], "z": [0.5, 1.2], "q": [0.3, 0.7]}, [0, 1],
            local_steps=2, local_epochs=None, rounds=3)


@pytest.mark.parametrize("name", ["fedprox", "fedinit", "feddecay", "ditto", "fedbug"])
def test_dp_composes_with_model_sized_uplinks(name):
    x, y, parts, model = tiny_problem()
    local = algorithms.local_sgd(0.2)
    inner = {"fedprox": lambda: algorithms.fedprox(local, mu=0.1),
             "fedinit": lambda: algorithms.fedinit(local),
             "feddecay": lambda: algorithms.feddecay(local, beta=0.5),
             "ditto": lambda: algorithms.ditto(local, lam=0.1),
             "fedbug": lambda: algorithms.gradual_unfreezing(
                 algorithms.fedavg(local), (("fc1",), ("fc2",)), fraction=0.5)}[name]()
    alg = algorithms.dp(inner, 0.5, 1.0, COHORT)
    round_fn = make_round(alg, model, federate(x, y, parts, NUM_CLASSES),
                          clients_per_round=COHORT, batch_size=BATCH, local_steps=STEPS)
    state = init_state(alg, model.init(jax.random.PRNGKey(0)), len(parts), seed=0)
    before = jax.device_get(state.params)
    state, metrics = round_fn(state)
    assert bool(metrics["params_finite"]) and float(metrics["clip_norm"]) == 0.5
    assert global_norm(tree_map(lambda a, b: np.asarray(a) - np.asarray(b), state.params,
                                before)) > 0


@pytest.mark.parametrize("make,leak", [
    (lambda l: algorithms.scaffold(l), "more than one model-sized update"),
    (lambda l: algorithms.feddyn(l), "more than one model-sized update"),
    (lambda l: algorithms.fedexp(l), "more than one model-sized update"),
    (lambda l: algorithms.fedga(l), "first message (cohort_start)"),
])
def test_algorithms_whose_clients_send_more_are_refused(make, leak):
    x, y, parts, model = tiny_problem()
    with pytest.raises(FljaxError, match=re.escape(leak)):
        alg = algorithms.dp(make(algorithms.local_sgd(0.1)), 0.5, 1.0, COHORT)
        round_fn = make_round(alg, model, federate(x, y, parts, NUM_CLASSES),
                              clients_per_round=COHORT, batch_size=BATCH, local_steps=STEPS)
        round_fn(init_state(alg, model.init(jax.random.PRNGKey(0)), len(parts), seed=0))


@pytest.mark.parametrize("kwargs,message", [
    (dict(clip_norm=-1.0), "clip_norm must be > 0 and finite, got -1.0"),
    (dict(noise_multiplier=float("nan")), "noise_multiplier must be >= 0 and finite, got nan"),
    (dict(cohort_size=0), "cohort_size must be a whole number >= 1, got 0"),
    (dict(target_quantile=1.5), "target_quantile must be in [0, 1], got 1.5"),
    (dict(target_quantile=0.5, noise_multiplier=3.0),
     "noise_multiplier must be below 2 * count_noise = 1 with adaptive clipping"),
    (dict(count_noise=1.0), "count_noise is set but target_quantile is not"),
])
def test_bad_values_are_one_line_errors(kwargs, message):
    args = {"clip_norm": 0.5, "noise_multiplier": 1.0, "cohort_size": 10, **kwargs}
    with pytest.raises(FljaxError, match=re.escape(message)):
        algorithms.dp(algorithms.fedavg(algorithms.local_sgd(0.1)), **args)


def test_a_cohort_size_that_is_not_the_rounds_is_refused():
    x, y, parts, model = tiny_problem()
    alg = algorithms.dp(algorithms.fedavg(algorithms.local_sgd(0.1)), 0.5, 1.0, 5)
    round_fn = make_round(alg, model, federate(x, y, parts, NUM_CLASSES),
                          clients_per_round=COHORT, batch_size=BATCH, local_steps=STEPS)
    with pytest.raises(FljaxError, match="dp's cohort_size 5 differs from the round's cohort of 3"):
        round_fn(init_state(alg, model.init(jax.random.PRNGKey(0)), len(parts), seed=0))


def test_pld_cannot_account_fixed_size_cohorts():
    with pytest.raises(FljaxError, match="accountant 'pld' cannot account fixed-size cohorts"):
        privacy.epsilon(1.0, 10, 1e-5, cohort_size=5, num_clients=50, accountant_name="pld")


def cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "fljax", *args], cwd=cwd, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})


DP_RUN = ["--dataset", "digits", "--model", "mlp", "--num-clients", "20",
          "--clients-per-round", "5", "--participation", "bernoulli", "--local-steps", "2",
          "--eval-every", "2", "--checkpoint-every", "2", "--accountant", "pld",
          "--dp-delta", "1e-3"]
ADAPTIVE = {"clip_norm": 0.5, "target_quantile": 0.5, "count_noise": 2.0}


def evaluations(run):
    records = [json.loads(line) for line in open(run / "metrics.jsonl")]
    return [r for r in records if r["kind"] == "eval"]


def test_cli_dp_run_reports_epsilon_and_resumes_bit_identically(tmp_path, monkeypatch, capsys):
    """--target-epsilon calibrates z for the 6 planned rounds; every evaluation logs the epsilon
    spent, the last at most the target; the same z given as noise_multiplier, stopped at round 2
    and resumed to 6, ends with the same model, accuracies and epsilons. With --target-epsilon
    the planned rounds cannot change on resume (they set z): refused in one line, exit 2, before
    the noise is calibrated, the run directory unchanged."""
    whole, part = tmp_path / "whole", tmp_path / "part"
    wrappers = ["--wrappers", json.dumps({"dp": ADAPTIVE})]
    done = cli(*DP_RUN, *wrappers, "--target-epsilon", "8", "--rounds", "6",
               "--out-dir", str(whole), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "epsilon" in done.stdout
    ours = evaluations(whole)
    spent = functools.partial(privacy.epsilon, delta=1e-3, cohort_size=5, num_clients=20,
                              participation="bernoulli", accountant_name="pld")
    z = ours[0]["noise_multiplier"]     # calibrated: the 6 rounds spend at most 8, 1e-4 less z more
    assert spent(z, 6) <= 8.0 < spent(z * (1 - 1e-4), 6)
    assert [e["round"] for e in ours] == [2, 4, 6]
    for e in ours:
        assert e["noise_multiplier"] == z and e["delta"] == 1e-3
        assert e["epsilon"] == spent(z, e["round"])
    assert ours[0]["epsilon"] < ours[-1]["epsilon"] <= 8.0
    given = ["--wrappers", json.dumps({"dp": {**ADAPTIVE, "noise_multiplier": z}})]
    for rounds in ("2", "6"):
        step = cli(*DP_RUN, *given, "--rounds", rounds, "--out-dir", str(part), cwd=tmp_path)
        assert step.returncode == 0, step.stderr
    theirs = evaluations(part)
    keys = ("round", "epsilon", "accuracy", "loss")
    assert [[e[k] for k in keys] for e in theirs] == [[e[k] for k in keys] for e in ours]
    def no_calibration(*args, **kwargs):
        raise AssertionError("the noise was calibrated before the resume was refused")

    monkeypatch.setattr(config_module, "calibrate", no_calibration)
    before = snapshot(whole)
    assert main([*DP_RUN, *wrappers, "--target-epsilon", "8", "--rounds", "8",
                 "--out-dir", str(whole)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "calibrated its DP noise to target_epsilon 8.0 over rounds=6" in err[0]
    assert snapshot(whole) == before


@pytest.mark.parametrize("flags,message", [
    (["--target-epsilon", "2"], "target_epsilon needs the dp wrapper"),
    (["--wrappers", '{"dp": {"clip_norm": 0.5}}', "--accountant", "pld"],
     "accountant 'pld' cannot account fixed-size cohorts"),
    (["--wrappers", '{"dp": {"clip_norm": 0.5, "noise_multiplier": 1.0}}',
      "--target-epsilon", "2"], "both set the noise; give one"),
    (["--wrappers", '{"dp": {"clip_norm": 0.5, "noise_multiplier": 1.0}}', "--dp-delta", "2"],
     "dp_delta must be in (0, 1), got 2.0"),
    (["--wrappers", '{"dp": {"clip_norm": 0.5, "noise_multiplier": 1.0}}', "--algorithm",
      "scaffold"], "dp cannot privatize scaffold"),
])
def test_cli_bad_dp_input_is_one_line_exit_2(tmp_path, flags, message, capsys):
    code = main(["--rounds", "2", "--out-dir", str(tmp_path / "run"), *flags])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    lines = err.splitlines()
    assert len(lines) == 1 and message in lines[0], err
