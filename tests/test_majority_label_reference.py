"""experiments/majority_label_reference.py: the majority-label rule on the sweep's own user splits,
checked against a count written out per user (no compiled program)."""
import collections
import json
import statistics

import numpy as np
import scipy.stats

from fljax.data import loaders
from fljax.data.users import split_users
from fljax.runner.config import ExperimentConfig
from tests.experiment_script import load

reference = load("majority_label_reference")

SWEEP = {"base": {"dataset": "synthetic_1_1", "partition": "natural", "num_clients": 30,
                  "clients_per_round": 5, "model": "mlp", "new_users": 0.2,
                  "user_val_fraction": 0.2, "user_test_fraction": 0.2, "rounds": 1},
         "rows": {"users": {}, "pooled": {"user_test_fraction": 0.0, "user_val_fraction": 0.0,
                                     "new_users": 0.0}},
         "columns": {"FedAvg": {"algorithm": "fedavg"}, "FedProx": {"algorithm": "fedprox"}},
         "seeds": [0, 1]}


def test_majority_accuracy_takes_the_smallest_label_on_a_tie():
    y = np.array([3, 1, 1, 3, 2, 3, 1])
    assert reference.majority_accuracy(y, np.array([0, 1, 2, 3]), np.array([5, 6])) == 0.5
    assert reference.majority_accuracy(y, np.array([0, 1, 2, 3]), np.array([4])) == 0.0


def test_reference_equals_a_per_user_count_on_the_runs_splits(tmp_path, capsys):
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(SWEEP))
    folder = tmp_path / "results"
    folder.mkdir()
    accuracy = {0: 0.5, 1: 0.75}              # a column's selected runs, one per seed
    folder.joinpath("runs.csv").write_text(
        "row,column,setting,seed,selected,existing_test_acc,new_test_acc\n"
        + "".join(f"users,FedAvg,lr=0.1,{seed},1,{acc},\n" for seed, acc in accuracy.items())
        + "users,FedAvg,lr=0.2,0,0,0.99,\npooled,FedAvg,lr=0.1,0,1,0.99,\n")
    assert reference.main([str(path), "--seeds", "0-1", "--results", str(folder)]) == 0
    printed = capsys.readouterr().out
    dataset = loaders.load_dataset("synthetic_1_1")
    for group in ("existing", "new"):
        per_seed = []
        for seed in (0, 1):
            config = ExperimentConfig(**{**SWEEP["base"], "seed": seed}).validate()
            assert config.validation_fraction == 0   # every example stays with its user
            parts = [np.flatnonzero(dataset.user_train == u) for u in range(30)]
            users = split_users(parts, new_fraction=0.2, val_fraction=0.2, test_fraction=0.2,
                                seed=seed, roles=dataset.role_train)
            scores = []
            for u in getattr(users, group):
                counts = collections.Counter(dataset.y_train[users.train[u]].tolist())
                top = max(counts.values())
                label = min(c for c, n in counts.items() if n == top)
                test = dataset.y_train[users.test[u]]
                scores.append(100 * sum(int(t == label) for t in test) / len(test))
            per_seed.append(statistics.fmean(scores))
        expected = f"{statistics.mean(per_seed):.2f} ± {statistics.stdev(per_seed):.2f}"
        assert f"{group} users: {expected}" in printed
        if group == "existing":            # paired by seed with the selected runs
            diff = [100 * accuracy[s] - per_seed[s] for s in (0, 1)]
            p = scipy.stats.ttest_1samp(diff, 0.0).pvalue
            assert (f"    FedAvg − reference: {statistics.mean(diff):+.2f} ± "
                    f"{statistics.stdev(diff):.2f} (p = {p:.2g}, n = 2)") in printed
    assert printed.count("− reference") == 1   # no new-user scores in the file: no line


def test_a_row_without_per_user_evaluation_is_refused_in_one_line(tmp_path, capsys):
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(SWEEP))
    assert reference.main([str(path), "--row", "pooled"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "user_test_fraction is 0" in error
    assert reference.main([str(path), "--results", str(tmp_path / "none")]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "holds no runs.csv" in error
