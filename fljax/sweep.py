"""Sweeps: one JSON file describes a paper's table as a grid of runs; run it and tabulate it.

A sweep file::

    {"title": "...",
     "base": {ExperimentConfig values shared by every run},
     "rows": {"row name": {values}, ...},            e.g. data settings
     "columns": {"column name": {values}, ...},      e.g. methods
     "seeds": [0, 1, 2],
     "target_accuracy": 0.67,                        optional: report rounds, bytes, FLOPs
                                                     and seconds to reach it
     "metrics": {"existing users": "existing_test_acc", "new users": "new_test_acc"},
                                                     optional: what to tabulate (a key of the
                                                     evaluation records per label: test scores,
                                                     evaluation probes, or the last round's
                                                     metrics such as FedInit's "divergence" or a
                                                     probe's; default the test accuracy). A list
                                                     of keys takes the first a run logs, e.g.
                                                     ["gamma/accuracy", "accuracy"]: FedDyn's
                                                     aggregate where a run has it
     "scales": {"cpu": {"base": {values}, "row or column name": {values},
                        "target_accuracy": 0.9}, "full": {...}}}

Run (row, column, seed) has the config ``base + scale.base + row + scale[row] + column +
scale[column] + {seed, out_dir}``: a scale overrides the shared values and any row's or column's
own (e.g. a smaller switch round on CPU). Its out_dir is ``OUT/scale/row/column/seed_S``; each run
resumes from its checkpoints, so a sweep that stopped continues where it stopped and a finished
run is not trained again. The table gives the final test accuracy (or each of the ``metrics``) of
every cell as mean +- std over seeds (accuracies in %, other metrics as logged), and, if set, the
rounds, megabytes sent, GFLOPs and seconds to the target accuracy.
"""

from __future__ import annotations

import json
import os
import re
import statistics
from typing import Any, Callable, NamedTuple

from fljax.config import ExperimentConfig
from fljax.errors import FljaxError
from fljax.train import to_target

SWEEP_KEYS = {"title", "base", "rows", "columns", "seeds", "target_accuracy", "scales", "notes",
              "metrics"}


class Cell(NamedTuple):
    row: str
    column: str
    seed: int
    config: ExperimentConfig


def load_sweep(path: str) -> dict[str, Any]:
    """Read and check a sweep file."""
    if not os.path.isfile(path):
        raise FljaxError(f"sweep file {path!r} does not exist")
    with open(path) as f:
        try:
            sweep = json.load(f)
        except json.JSONDecodeError as e:
            raise FljaxError(f"sweep file {path!r} is not valid JSON: {e.msg} at line "
                             f"{e.lineno}") from None
    if not isinstance(sweep, dict):
        raise FljaxError(f"sweep file {path!r} must hold a JSON object")
    unknown = sorted(set(sweep) - SWEEP_KEYS)
    if unknown:
        raise FljaxError(f"unknown sweep key(s) {unknown} in {path!r}; allowed: "
                         f"{sorted(SWEEP_KEYS)}")
    for key in ("rows", "columns"):
        if not isinstance(sweep.get(key), dict) or not sweep[key]:
            raise FljaxError(f"sweep {key!r} must be a non-empty object of name -> config values")
        bad = [n for n in sweep[key] if not re.fullmatch(r"[\w.+\->() ]+", n)]
        if bad:
            raise FljaxError(f"sweep {key} names {bad} may hold only letters, digits, spaces "
                             f"and _ . + - > ( )")
    metrics = sweep.get("metrics", {})
    if not isinstance(metrics, dict) or not all(
            isinstance(v, str) or (isinstance(v, list) and v and all(isinstance(k, str)
                                                                     for k in v))
            for v in metrics.values()):
        raise FljaxError(f"sweep 'metrics' must be an object of label -> evaluation key (or a "
                         f"list of keys, the first logged one counts), got {metrics!r}")
    seeds = sweep.get("seeds", [0])
    if not (isinstance(seeds, list) and seeds and all(isinstance(s, int) for s in seeds)):
        raise FljaxError(f"sweep 'seeds' must be a non-empty list of integers, got {seeds!r}")
    return sweep


def cells(sweep: dict[str, Any], scale: str | None, out_dir: str,
          seeds: list[int] | None = None, **changes) -> list[Cell]:
    """Every run of the sweep at ``scale`` (a key of its 'scales', or None for the base values),
    with ``changes`` (config values) applied last."""
    scales = sweep.get("scales", {})
    if scale is not None and scale not in scales:
        raise FljaxError(f"scale must be one of {sorted(scales)}, got {scale!r}")
    overrides = scales.get(scale, {}) if scale is not None else {}
    names = set(sweep["rows"]) | set(sweep["columns"]) | {"base"}
    unknown = sorted(set(overrides) - names - {"target_accuracy"})
    if unknown:
        raise FljaxError(f"scale {scale!r} overrides unknown rows or columns {unknown}")
    result = []
    for row, row_values in sweep["rows"].items():
        for column, column_values in sweep["columns"].items():
            for seed in seeds or sweep.get("seeds", [0]):
                values = {**sweep.get("base", {}), **overrides.get("base", {}), **row_values,
                          **overrides.get(row, {}), **column_values, **overrides.get(column, {}),
                          "seed": seed,
                          "out_dir": os.path.join(out_dir, scale or "base", slug(row),
                                                  slug(column), f"seed_{seed}"),
                          **changes}
                try:
                    config = ExperimentConfig().replace(**values).validate()
                except FljaxError as e:
                    raise FljaxError(f"sweep run {row!r} / {column!r}: {e}") from None
                result.append(Cell(row, column, seed, config))
    return result


def parse_settings(settings: list[str]) -> dict[str, Any]:
    """``["rounds=3", "dataset=cifar100"]`` -> {"rounds": 3, "dataset": "cifar100"}: each value is
    read as JSON, or taken as a string if it is not JSON."""
    changes = {}
    for setting in settings:
        key, sep, text = setting.partition("=")
        if not sep or not key:
            raise FljaxError(f"--set takes KEY=VALUE, got {setting!r}")
        try:
            changes[key] = json.loads(text)
        except json.JSONDecodeError:
            changes[key] = text
    return changes


def slug(name: str) -> str:
    """A directory name for a row or column name."""
    return re.sub(r"[^\w.+-]+", "_", name.replace("->", "_to_")).strip("_")


def rounds_to(evaluations: list[dict[str, Any]], target: float) -> int | None:
    """The first evaluated round whose test accuracy reaches ``target``, or None."""
    cost = to_target(evaluations, target)
    return None if cost is None else cost["rounds"]


# (label, key of to_target's result, scale) of the cost-to-target lines
TARGET_COSTS = (("rounds", "rounds", 1.0), ("MB", "bytes", 1e-6), ("GFLOPs", "flops", 1e-9),
                ("seconds", "seconds", 1.0))


def run_sweep(sweep: dict[str, Any], cell_list: list[Cell],
              train: Callable[[ExperimentConfig], list[dict[str, Any]]]) -> dict[Cell, list]:
    """Run every cell with ``train(config) -> evaluations``; their evaluations by cell."""
    results = {}
    for i, cell in enumerate(cell_list):
        print(f"[{i + 1}/{len(cell_list)}] {cell.row} / {cell.column} / seed {cell.seed}",
              flush=True)
        results[cell] = train(cell.config)
    return results


def table(sweep: dict[str, Any], results: dict[Cell, list], scale: str | None = None) -> str:
    """Markdown: final test accuracy (%) of each cell (a line per row and metric, if the sweep
    names ``metrics``) as mean +- std over seeds, the best of a line in bold; if the sweep sets a
    target accuracy, a line of rounds to reach it (mean over seeds; x where some seed never
    reached it)."""
    columns = list(sweep["columns"])
    target = sweep.get("scales", {}).get(scale, {}).get("target_accuracy",
                                                        sweep.get("target_accuracy"))
    lines = ["| setting | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for row in sweep["rows"]:
        runs = [[evals for cell, evals in results.items()
                 if cell.row == row and cell.column == column and evals] for column in columns]
        for label, keys in sweep.get("metrics", {"": "accuracy"}).items():
            keys = [keys] if isinstance(keys, str) else keys
            key = keys[0]
            scale = 100 if "acc" in key else 1       # accuracies in %
            finals = [[scale * evals[-1][first_logged(evals[-1], keys)] for evals in r]
                      for r in runs]
            cells_text = [mean_std(f) for f in finals]
            if "acc" in key:
                best = max(range(len(columns)),
                           key=lambda j: statistics.mean(finals[j] or [-1.0]))
                cells_text[best] = f"**{cells_text[best]}**"
            name = f"{row}: {label}" if label else row
            lines.append(f"| {name} | " + " | ".join(cells_text) + " |")
        if target is not None:
            reach = [[to_target(evals, target) for evals in r] for r in runs]
            for label, key, scale in TARGET_COSTS:
                lines.append(f"| {row}: {label} to {100 * target:g}% | " + " | ".join(
                    "x" if not hit or None in hit else
                    f"{statistics.mean(scale * h[key] for h in hit):.3g}"
                    for hit in reach) + " |")
    return "\n".join(lines)


def first_logged(record: dict[str, Any], keys: list[str]) -> str:
    """The first of ``keys`` that an evaluation record holds (the last one if none does)."""
    return next((key for key in keys if key in record), keys[-1])


def mean_std(values: list[float]) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"
