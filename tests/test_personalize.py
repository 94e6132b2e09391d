"""Personalized evaluation (FedDecay (Anonymous, 2023) section 4): user splits, and
fine-tune-then-score equal to a float64 reference (each user's SGD steps in numpy, on the batches
fljax draws), in runs and CLI."""

import jax
import numpy as np
import pytest

from fljax.algorithms import local_sgd
from fljax.runner.cli import main
from fljax.runner.config import ExperimentConfig
from fljax.data.batching import client_batch
from fljax.data.federated import federate
from fljax.data.users import split_users
from fljax.errors import FljaxError
from fljax.runner.experiment import build
from fljax.core.personalize import finetune_key, make_user_evaluator
from fljax.runner.train import run
from tests.reference import mlp_loss_and_grad, user_summaries
from tests.test_drift_corrections import local_train
from tests.test_fedavg_reference import NUM_CLASSES, tiny_problem

SIZES = [30, 12, 21, 9, 40, 16, 25, 11, 14, 18]


def parts_of(sizes, seed=0):
    perm = np.random.default_rng(seed).permutation(sum(sizes))
    return np.split(perm, np.cumsum(sizes)[:-1])


def test_split_users_partitions_every_user_and_holds_out_new_users():
    parts = parts_of(SIZES)
    users = split_users(parts, new_fraction=0.2, val_fraction=0.2, test_fraction=0.3, seed=4)
    assert len(users.new) == 2 and len(users.existing) == 8
    assert sorted([*users.new, *users.existing]) == list(range(10))
    for u, ids in enumerate(parts):
        train, val, test = users.train[u], users.val[u], users.test[u]
        assert sorted([*train, *val, *test]) == sorted(ids)            # each example once
        assert len(val) == max(1, round(0.2 * len(ids)))
        assert len(test) == max(1, round(0.3 * len(ids)))
    again = split_users(parts, new_fraction=0.2, val_fraction=0.2, test_fraction=0.3, seed=4)
    other = split_users(parts, new_fraction=0.2, val_fraction=0.2, test_fraction=0.3, seed=5)
    assert all(np.array_equal(a, b) for a, b in zip(users.test, again.test))
    assert np.array_equal(users.new, again.new)
    assert not all(np.array_equal(a, b) for a, b in zip(users.test, other.test))
    none_held = split_users(parts, new_fraction=0.0, val_fraction=0.0, test_fraction=0.2, seed=0)
    assert len(none_held.new) == 0 and all(len(v) == 0 for v in none_held.val)


@pytest.mark.parametrize("kwargs, message", [
    (dict(new_fraction=0.95), "leaving none to train"),
    (dict(new_fraction=1.0), "new_users must be a number in [0, 1), got 1.0"),
    (dict(val_fraction=0.5, test_fraction=0.5), "must be < 1"),
    (dict(test_fraction=-0.1), "user_test_fraction must be a number in [0, 1)"),
    (dict(val_fraction=0.4, test_fraction=0.55), "user 1 has 12 examples: too few"),
])
def test_bad_user_splits_are_rejected(kwargs, message):
    args = {**dict(new_fraction=0.0, val_fraction=0.0, test_fraction=0.2, seed=0), **kwargs}
    with pytest.raises(FljaxError) as e:
        split_users(parts_of(SIZES), **args)
    assert message in str(e.value)


def reference_scores(params, x, y, users, key, *, steps, batch, lr, clip):
    """Per user: ``steps`` torch-style SGD steps (clip, then lr) on its train split, batches as
    fljax draws them; then its accuracy and mean loss on the test split; the paper's summaries."""
    max_train = max(len(t) for t in users.train)
    acc, loss = [], []
    for u in range(len(users.train)):
        train = users.train[u]
        batch_key, _ = jax.random.split(jax.random.fold_in(key, u))
        schedule = [tuple(np.asarray(a) for a in client_batch(batch_key, len(train), k, batch,
                                                              max_train)) for k in range(steps)]
        schedule = [(p, m.astype(np.float64)) for p, m in schedule]
        local = local_train(params, x, y, train, schedule, lr=lr, momentum=0.0,
                            weight_decay=0.0, clip=clip)
        test = users.test[u]
        mean_loss, _ = mlp_loss_and_grad(local, x[test], y[test], np.ones(len(test)))
        h = np.maximum(x[test].reshape(len(test), -1) @ local["fc1"]["kernel"]
                       + local["fc1"]["bias"], 0.0)
        logits = h @ local["fc2"]["kernel"] + local["fc2"]["bias"]
        acc.append(np.mean(logits.argmax(1) == y[test]))
        loss.append(mean_loss)
    return user_summaries(acc, loss, users)


@pytest.mark.parametrize("steps, batch, clip", [(0, 4, None), (7, 4, 0.5), (3, None, None)])
def test_fine_tune_then_score_matches_float64_reference(steps, batch, clip):
    """S steps of fine-tuning from the global model (several epochs for the small users at
    batch 4; full batch with None), scored on each user's test split."""
    with jax.enable_x64(True):
        x, y, _, model = tiny_problem()
        sizes = [7, 3, 12, 5, 9, 4]
        parts = parts_of(sizes, seed=1)
        x, y = x[:sum(sizes)], y[:sum(sizes)]
        users = split_users(parts, new_fraction=0.34, val_fraction=0.0, test_fraction=0.34,
                            seed=2)
        params = jax.tree.map(lambda a: np.asarray(a, np.float64),
                              model.init(jax.random.PRNGKey(1)))
        data = federate(x, y, [users.train[i] for i in users.existing], NUM_CLASSES)
        evaluate = make_user_evaluator(
            model, data, users, steps=steps, batch_size=batch,
            finetune=local_sgd(0.4, clip_norm=clip).chain(0))
        key = finetune_key(jax.random.PRNGKey(3), 5)
        got = evaluate(params, key)
        max_train = max(len(t) for t in users.train)
        expected = reference_scores(params, x, y, users, key, steps=steps,
                                    batch=batch or max_train, lr=0.4, clip=clip)
        untuned = make_user_evaluator(model, data, users, steps=0, batch_size=batch,
                                      finetune=local_sgd(0.4).chain(0))(params, key)
    assert set(got) == set(expected)
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-12, atol=1e-14, err_msg=name)
    assert (untuned["existing_test_loss"] != got["existing_test_loss"]) == (steps > 0)


CONFIG = dict(rounds=4, eval_every=2, num_clients=10, clients_per_round=4, new_users=0.2,
              user_val_fraction=0.2, user_test_fraction=0.2, finetune_steps=3, local_steps=2,
              local_epochs=None)


def test_a_run_trains_on_existing_users_only_and_logs_both_groups(tmp_path):
    config = ExperimentConfig().replace(out_dir=str(tmp_path / "a"), **CONFIG)
    experiment = build(config)
    assert experiment.data.num_clients == 8                  # 2 of 10 users held out
    evaluations = run(config, progress=False, experiment=experiment)
    last = evaluations[-1]
    for group in ("existing", "new"):
        for split in ("test", "val"):
            assert 0.0 <= last[f"{group}_{split}_acc_p10"] <= last[f"{group}_{split}_acc"] <= 1.0
    again = run(config.replace(out_dir=str(tmp_path / "b")), progress=False)
    assert [{k: v for k, v in e.items() if k != "time_s"} for e in again] == \
        [{k: v for k, v in e.items() if k != "time_s"} for e in evaluations]   # deterministic


def test_runs_built_together_share_one_per_user_program_unless_models_are_personal(tmp_path):
    """A batch's runs (one ``shared`` dict, as ``build_batch`` passes) with other seeds and lrs,
    and users of the same sizes, share the compiled per-user program (one executable, not one per
    run) and score as the run alone; an algorithm with personal models keeps its own (its
    program reads the algorithm's state)."""
    shared = {}
    configs = [ExperimentConfig().replace(out_dir=str(tmp_path / f"r{i}"), **CONFIG,
                                          partition="iid", **change)
               for i, change in enumerate([{}, {"seed": 1}, {"lr": 0.2}])]
    together = [build(c, shared=shared) for c in configs]
    assert len({e.evaluate_users.program for e in together}) == 1
    alone = build(configs[1])
    assert alone.evaluate_users.program is not together[1].evaluate_users.program
    key = jax.random.PRNGKey(3)      # seed 1's users, scored by the program seed 0's run made
    params = alone.initial_params()
    assert together[1].evaluate_users(params, key) == alone.evaluate_users(params, key)
    ditto = [build(c.replace(algorithm="ditto"), shared=shared).evaluate_users.program
             for c in configs[:2]]
    assert ditto[0] is not ditto[1]


def test_cli_prints_existing_and_new_user_columns(tmp_path, capsys):
    argv = ["--out-dir", str(tmp_path), "--quiet"] + [
        f"--{k.replace('_', '-')}={v}" for k, v in CONFIG.items() if v is not None]
    assert main(argv) == 0
    header = [line for line in capsys.readouterr().out.splitlines() if "test acc" in line][0]
    assert header.split()[-4:] == ["existing", "new", "time", "(s)"]


@pytest.mark.parametrize("change, message", [
    (dict(new_users=0.2, user_test_fraction=0.0), "need user_test_fraction > 0"),
    (dict(user_test_fraction=0.5, user_val_fraction=0.5), "must be < 1"),
    (dict(user_test_fraction=0.2, finetune_steps=-1), "finetune_steps must be an integer >= 0"),
    (dict(user_test_fraction=0.2, finetune_lr=0.0), "finetune_lr must be > 0"),
    (dict(user_test_fraction=0.2, new_users=1.0), "new_users must be in [0, 1)"),
])
def test_bad_personalization_settings_are_rejected(change, message):
    with pytest.raises(FljaxError) as e:
        ExperimentConfig().replace(**change).validate()
    assert message in str(e.value)


def test_cohort_larger_than_the_existing_users_is_rejected(tmp_path):
    config = ExperimentConfig().replace(out_dir=str(tmp_path), **{**CONFIG,
                                                                  "clients_per_round": 9})
    with pytest.raises(FljaxError, match=r"clients_per_round \(9\) must be <= the 8 existing"):
        build(config)
