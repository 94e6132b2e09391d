"""Merge result folders of one sweep into one, as if all their runs had trained in one call.

    python experiments/merge_results.py SWEEP.json FOLDER [FOLDER ...] --out FOLDER
        [--scale cpu] [--rows ROW ...] [--columns COLUMN ...]

A run's numbers depend only on its config and seed (training is deterministic), so a run that
trained in another call of ``fljax sweep`` is the same run. This script is for a sweep whose
columns or grid points ran in separate calls: for example a grid extension under the tuning rule
that trained only the new points, or a set of columns run on to more rounds.

It reads each folder's ``runs.csv`` (every run's reported evaluation: its last, or
with the sweep's ``best_round`` its best round's) and ``curves.csv`` (every
evaluation of the selected points' runs), either of them gzipped or not (a checked-in results
folder keeps a large ``curves.csv.gz``). A run found in two folders must have the same numbers
in both; otherwise the script stops. It then makes the selection again over all the runs, as
``fljax sweep`` would, and writes the same three files ``fljax sweep`` writes: ``results.md``,
``runs.csv`` and ``curves.csv`` (``fljax.runner.sweep.table`` and ``results_csv``). The
heading's data and models are the sweep file's at ``--scale`` (a ``--set`` given to ``fljax
sweep`` is not known here).

It stops if the new selection picks a grid point whose curves no folder holds. The CSVs keep 6
significant digits, so a selection between two points closer than that may differ from the one
a single call would make; the script stops on such a tie. Each number is read back as the
float32 nearest to its 6 digits (fljax logs float32 scores), so a test accuracy (a count over
the test set, exact in 6 digits) is the logged value itself and the table's accuracy lines equal
one call's; a score that 6 digits do not pin down (a validation accuracy over 6,000 examples)
may move a line computed from it, the validation gain of the last quarter, by 0.01.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import os
import statistics
import sys

import numpy

from fljax.errors import FljaxError
from fljax.runner import sweep as sweeps


def parse_value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_setting(text: str) -> tuple:
    """``"lr=0.2; algorithm_args.beta=0.1"`` -> ``(("lr", 0.2), ("algorithm_args.beta", 0.1))``."""
    if not text:
        return ()
    return tuple((key, parse_value(value)) for key, value in
                 (part.split("=", 1) for part in text.split("; ")))


def evaluation(record: dict) -> dict:
    """One CSV line as the evaluation dict ``fljax sweep`` keeps (empty fields left out)."""
    out = {"round": int(record["round"]), "diverged": record["diverged"] == "1"}
    for key, value in record.items():
        if key not in ("row", "column", "setting", "seed", "selected", "round", "diverged") \
                and value != "":
            out[key] = float(numpy.float32(value))
    return out


def open_csv(folder: str, name: str):
    """``folder/name``, or ``folder/name.gz`` read as text; one line if neither exists."""
    path = os.path.join(folder, name)
    if os.path.exists(path):
        return open(path)
    if os.path.exists(path + ".gz"):
        return gzip.open(path + ".gz", "rt")
    raise FljaxError(f"{folder!r} has no {name} (nor {name}.gz): give the folders fljax sweep "
                     f"wrote its results files to")


def read_folder(folder: str) -> tuple[dict, dict]:
    """({run key: its reported evaluation}, {run key: all its evaluations}) of one folder, in its
    order; a run key is (row, column, setting, seed)."""
    def key(record):
        return (record["row"], record["column"], parse_setting(record["setting"]),
                int(record["seed"]))
    last, curves = {}, {}
    with open_csv(folder, "runs.csv") as f:
        for record in csv.DictReader(f):
            last[key(record)] = evaluation(record)
    with open_csv(folder, "curves.csv") as f:
        for record in csv.DictReader(f):
            curves.setdefault(key(record), []).append(evaluation(record))
    return last, curves


def merged_runs(folders: list[str]) -> tuple[dict, dict]:
    """The union of the folders' runs, first-seen order; stops where two folders disagree."""
    last, curves = {}, {}
    for folder in folders:
        more_last, more_curves = read_folder(folder)
        for key, final in more_last.items():
            if key in last and last[key] != final:
                raise FljaxError(f"{folder}: run {key} ends with {final}, another folder has "
                                 f"{last[key]}: not the same run")
            last.setdefault(key, final)
        for key, evals in more_curves.items():
            if key in curves and curves[key] != evals:
                raise FljaxError(f"{folder}: the curve of run {key} differs from another "
                                 f"folder's")
            curves.setdefault(key, evals)
    return last, curves


def results_of(spec: dict, last: dict, curves: dict) -> dict:
    """``{Cell: evaluations}`` as ``fljax sweep`` holds them: the whole curve where a folder has
    it, else the reported evaluation (enough to select on)."""
    results = {}
    for (row, column, setting, seed), final in last.items():
        if row in spec["rows"] and column in spec["columns"]:
            cell = sweeps.Cell(row, column, seed, None, setting)
            results[cell] = curves.get((row, column, setting, seed), [final])
    for row in spec["rows"]:
        for column in spec["columns"]:
            check_selection(spec, results, row, column, curves)
    return results


def check_selection(spec: dict, results: dict, row: str, column: str, curves: dict) -> None:
    """Stop where the merged selection needs a curve no folder holds, or is a 6-digit tie."""
    best, best_runs = sweeps.selected(spec, results, row, column)
    if not best_runs:
        return
    key = spec.get("selection", "val_accuracy")
    by_point = {}
    for cell, evals in results.items():
        if (cell.row, cell.column) == (row, column):
            by_point.setdefault(cell.setting, []).append(evals)
    if len(by_point) > 1:
        means = sorted(statistics.mean(sweeps.reported(spec, e).get(key, 0.0) for e in point_runs)
                       for point_runs in by_point.values()
                       if not any(sweeps.stopped(e) for e in point_runs))
        if len(means) > 1 and abs(means[-1] - means[-2]) < 1e-6:
            raise FljaxError(f"{row!r} / {column!r}: two grid points tie on {key} to 6 digits; "
                             f"select in one call of fljax sweep instead")
    missing = [cell.seed for cell in results if (cell.row, cell.column, cell.setting)
               == (row, column, best) and (row, column, best, cell.seed) not in curves]
    if missing:
        raise FljaxError(f"{row!r} / {column!r}: the selected point {best} has no curves in "
                         f"any folder (seeds {missing})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep_file")
    parser.add_argument("folders", nargs="+", help="result folders (runs.csv, curves.csv)")
    parser.add_argument("--out", required=True, help="the folder to write")
    parser.add_argument("--scale", default="cpu")
    parser.add_argument("--rows", nargs="+")
    parser.add_argument("--columns", nargs="+")
    args = parser.parse_args(argv)
    try:
        spec = sweeps.restrict(sweeps.load_sweep(args.sweep_file), args.rows, args.columns)
        last, curves = merged_runs(args.folders)
        results = results_of(spec, last, curves)
        configs = [cell.config for cell in sweeps.cells(spec, args.scale, args.out)]
    except FljaxError as e:
        print(f"merge_results: {e}", file=sys.stderr)
        return 2
    text = sweeps.results_markdown(spec, results, args.scale, configs,
                                   os.path.basename(args.sweep_file))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(text + "\n")
    for name, body in zip(("runs.csv", "curves.csv"), sweeps.results_csv(spec, results)):
        with open(os.path.join(args.out, name), "w") as f:
            f.write(body)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
