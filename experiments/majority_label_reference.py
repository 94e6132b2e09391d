"""The majority-label reference of a personalized-evaluation sweep: how well a user scores by
predicting its own most frequent training label, on the same splits the sweep's runs use.

    python experiments/majority_label_reference.py SWEEP_FILE [--scale S] [--row ROW] [--seeds 0-9]
        [--results FOLDER]

For each seed, the row's users are split as its runs split them (the first column's config at
that seed: the same data, validation hold-out, partition and ``fljax.data.users.split_users``
draw). User u predicts

    c_u = argmax_c #{i in train_u : y_i = c}      (the smallest label on a tie)

and scores acc_u = #{i in test_u : y_i = c_u} / |test_u|. Per group (existing users, who train in
the federation, and new users, held out) the line gives the unweighted mean of acc_u over the
group's users (FedDecay's Acc, as ``fljax.core.personalize`` reports it), as mean ± std over seeds.
A personalized method that does not beat this has learned little more than each user's label
skew (docs/reproductions/feddecay.md, Tables 3-4 at CPU scale). With ``--results`` (a folder the
sweep wrote, its ``runs.csv``), each column's selected runs are paired with the reference by seed:
COLUMN − reference, mean ± std over the seeds both have and a paired t-test's p.
"""
from __future__ import annotations

import argparse
import csv
import gzip
import os
import statistics
import sys

import numpy as np

from fljax.errors import FljaxError
from fljax.runner.experiment import client_parts, experiment_dataset
from fljax.runner.sweep import cells, load_sweep, mean_std, paired_difference, parse_seeds


def majority_accuracy(y: np.ndarray, train: np.ndarray, test: np.ndarray) -> float:
    """acc_u of one user: the share of its test labels equal to its most frequent training
    label (ids index ``y``)."""
    majority = np.argmax(np.bincount(y[train]))
    return float(np.mean(y[test] == majority))


def reference(config) -> dict[str, float]:
    """{'existing': Acc, 'new': Acc} in % of one run's users under the majority-label rule."""
    dataset, _ = experiment_dataset(config, {})
    users = client_parts(config, dataset)[3]
    if users is None:
        raise FljaxError("the row has no per-user evaluation (user_test_fraction is 0)")
    result = {}
    for group in ("existing", "new"):
        ids = getattr(users, group)
        if len(ids):
            result[group] = 100 * statistics.fmean(
                majority_accuracy(dataset.y_train, users.train[u], users.test[u]) for u in ids)
    return result


def selected_scores(folder: str, row: str, group: str) -> dict[str, dict[int, float]]:
    """{column: {seed: the group's test Acc in %}} of ``row``'s selected runs in ``folder``'s
    runs.csv (or runs.csv.gz)."""
    path = os.path.join(folder, "runs.csv")
    if not os.path.exists(path) and os.path.exists(path + ".gz"):
        path += ".gz"
    if not os.path.exists(path):
        raise FljaxError(f"--results {folder!r} holds no runs.csv: give a folder fljax sweep wrote")
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        lines = [line for line in csv.DictReader(f)
                 if line["row"] == row and line["selected"] == "1"]
    out: dict[str, dict[int, float]] = {}
    for line in lines:
        if line.get(f"{group}_test_acc"):
            out.setdefault(line["column"], {})[int(line["seed"])] = \
                100 * float(line[f"{group}_test_acc"])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file")
    parser.add_argument("--scale", default=None)
    parser.add_argument("--row", default=None, help="default: the sweep's first row")
    parser.add_argument("--seeds", default=None, help="e.g. 0-9 (default: the sweep's seeds)")
    parser.add_argument("--results", default=None,
                        help="a results folder of the sweep: pair its selected runs with the "
                             "reference by seed")
    args = parser.parse_args(argv)
    try:
        sweep = load_sweep(args.file)
        row = args.row or next(iter(sweep["rows"]))
        seeds = parse_seeds(args.seeds) if args.seeds else None
        first = {}
        for cell in cells(sweep, args.scale, "unused", seeds=seeds, rows=[row]):
            first.setdefault(cell.seed, cell.config)
        per_seed = {seed: reference(config) for seed, config in sorted(first.items())}
        scores = {group: selected_scores(args.results, row, group)
                  for group in ("existing", "new")} if args.results else {}
    except FljaxError as e:
        print(f"majority_label_reference: error: {e}", file=sys.stderr)
        return 2
    print(f"majority-label reference, {row!r}, seeds {sorted(first)} (test Acc, %, mean ± std "
          f"over seeds):")
    for group in ("existing", "new"):
        values = {seed: r[group] for seed, r in per_seed.items() if group in r}
        if not values:
            continue
        print(f"  {group} users: {mean_std(list(values.values()))}")
        for column, by_seed in scores.get(group, {}).items():
            seeds = sorted(set(by_seed) & set(values))
            print(f"    {column} − reference: "
                  f"{paired_difference([by_seed[s] for s in seeds], [values[s] for s in seeds])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
