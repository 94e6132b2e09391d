"""Sweeps: one JSON file describes a paper's table as a grid of runs; run it and tabulate it.

A sweep file::

    {"title": "...",
     "base": {ExperimentConfig values shared by every run},
     "rows": {"row name": {values}, ...},            e.g. data settings; a row's "cells":
                                                     {"column name": {values}} sets values of
                                                     that row's cell in that column only (they
                                                     override the column's)
     "columns": {"column name": {values}, ...},      e.g. methods; a column's "transfer":
                                                     {"from": "FedAvg", "keys": ["lr"]} takes
                                                     those grid keys' selected values of that
                                                     column, in the same row (below)
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
                        "target_accuracy": 0.9}, "full": {...}},
                                                     a scale may have its own "title" (e.g. a
                                                     real-image scale of a sweep whose title
                                                     names its toy data)
     "selection": "val_accuracy",                    optional: the evaluation key a grid is
                                                     selected on (maximized; default
                                                     val_accuracy: the validation split)
     "compare": [["FedGA", "FedAvg"], ...],          optional: paired differences to report
                                                     (of each tabulated metric)
     "best_round": "existing_val_acc",               optional: report each run at its
                                                     evaluation with the best value of this
                                                     key (FederatedScope's best round on the
                                                     validation split) instead of its last
     "cost_relative_to": "FedAvg",                   optional: lines of each column's bytes
                                                     and FLOPs over the whole run as a
                                                     multiple of this column's (FedDecay (Anonymous,
                                                     2023) Figure 1)
     "extend": ["lr"],                               optional: grid keys whose selected value
                                                     may not sit at the grid's edge (the
                                                     tuning rule, below)
     "bounds": {"algorithm_args.beta": [0, 1]},      optional: the values an ``extend`` key
                                                     may take; a step past a bound stops at it
     "extend_jointly": true,                         optional: extend the ``extend`` keys
                                                     together, by the selected point's whole
                                                     neighbourhood (below)
     "max_extensions": 8,                            optional: how many times the rule may
                                                     extend (default ``MAX_EXTENSIONS``, 4;
                                                     a scale may set its own)
     "hyperband": {"min_rounds": 10,                 optional: stop a cell's weak grid points
                   "reduction_factor": 3},           early (fljax.runner.hyperband: FedDecay's search;
                                                     a scale may set its own)
     "early_termination": {"fraction": 0.2,          optional, instead: stop the grid points
                           "margin": 0.05}}          more than margin below the best at 20% of
                                                     the rounds (fljax.runner.early_termination:
                                                     FedGA's B.2; a scale may set its own)

The tuning protocol of the papers: any level (base, a row, a column, a scale's entry) may hold a
``"grid"``: {config key: [values]}, where a key may reach into a JSON-object field with dots
(``"algorithm_args.mu"``, ``"wrappers.relaxed_init.beta"``). Grids merge key by key down the
levels: a row's ``{"batch_size": [16, 32, 64]}`` and a column's ``{"lr": [...]}`` give the cell
both; a later level's key replaces that key's values, and ``null`` drops it. Each cell runs every
point of its grid for every seed; its table entry is the point with the best mean over seeds of the final
``selection`` score, which must come from data held out of the test set (``validation_fraction``
> 0 gives ``val_accuracy``: a share of the training examples kept out of the clients), and the
entry reports the TEST scores of that point's runs. ``compare`` pairs two columns: the mean and
std over seeds of their difference in each tabulated metric (default the final test accuracy) at
the selected points (the same seed
on both sides: the same split, initialization and sampling) and the p-value of a paired t-test.

The tuning rule (``extend``): a cell whose selected value of an ``extend`` key is the smallest or
the largest value its grid tried has its grid extended one step beyond that edge, geometrically
(v_edge^2 / v_neighbour: 0.1, 0.2 -> 0.4; 0.05, 0.02 -> 0.008), and the new point runs for every
seed; a key with ``"bounds"`` [low, high] (FedDecay's beta lies in [0, 1]) steps at most to its
bound, and a selected value at its bound is no edge (nothing lies beyond it to try);
``extensions`` returns those runs, and ``fljax sweep`` (``extend_grids``) repeats until no
selected value sits at an edge, at most ``max_extensions`` times (default ``MAX_EXTENSIONS``). A
point where some seed diverged never wins, so a grid ends at the edge of stability. The table marks a selected value still at an edge,
and its line "val gain, last 25%" gives, at the selected point, the mean +- std over seeds of the
``selection`` score's rise over the last quarter of the rounds (the last evaluation minus the one
at 75% of the rounds): the evidence that the runs have stopped improving.

That rule moves one key at a time from the selected point, so where two keys interact (a larger lr
that is stable only at a larger beta) it can stop at a point whose joint neighbours score higher.
``"extend_jointly": true`` makes it a pattern search over the ``extend`` keys: around the selected
point, each key takes its neighbours among the values tried (or the next value past an edge, as
above) and every untried combination of {lower, selected, higher} over the keys runs (3^k - 1 at
most, for k keys), repeated until the selected point's whole neighbourhood has run.

Stagewise tuning (``transfer``): FedGA's appendix B.2 tunes FedAvg and large-batch SGD first,
"transferred the optimal hyperparameters ... and fixed them to then perform the search for the
best parameter beta", then fixed beta and searched the others again (Dandi, Barba, Jaggi, AAAI
2022). A column with ``"transfer": {"from": SOURCE, "keys": [grid keys of SOURCE]}`` waits until
every run of SOURCE in its row has finished (grid extensions included), then trains with SOURCE's
selected values of those keys and its own grid over the rest; a second column transferring
from it is the next stage. ``cells`` leaves a waiting column out, ``transfers`` gives the values
once its source has results, and ``fljax sweep`` runs stage after stage.

Run (row, column, seed) has the config ``base + scale.base + row + scale[row] + column +
scale[column] + {seed, out_dir}``: a scale overrides the shared values and any row's or column's
own (e.g. a smaller switch round on CPU). Its out_dir is ``OUT/scale/row/column/seed_S``; each run
resumes from its checkpoints, so a sweep that stopped continues where it stopped and a finished
run is not trained again. The table gives the final test accuracy (or each of the ``metrics``) of
every cell as mean +- std over seeds (accuracies in %, other metrics as logged), the best of a line
in bold only where its paired difference from the runner-up is significant (paired t-test over
the seeds, p < 0.05), and, if set, the rounds, megabytes sent, GFLOPs and seconds to the target
accuracy.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import math
import os
import re
import statistics
from typing import Any, Callable, NamedTuple

import scipy.stats

from fljax.runner.config import ExperimentConfig, current_names, one_local_work
from fljax.runner import early_termination, hyperband
from fljax.errors import FljaxError
from fljax.runner.grouping import group
from fljax.runner.train import Diverged, to_target

SWEEP_KEYS = {"title", "base", "rows", "columns", "seeds", "target_accuracy", "scales", "notes",
              "metrics", "selection", "compare", "best_round", "cost_relative_to", "extend",
              "bounds", "extend_jointly", "max_extensions", "hyperband", "early_termination"}
MAX_EXTENSIONS = 4
SIGNIFICANCE = 0.05     # a table marks a line's best only where its paired t-test gives p below
BOLD_RULE = (f"Bold: the best of its line, where its paired difference from the runner-up is "
             f"significant (paired t-test over the seeds, p < {SIGNIFICANCE}); a line without "
             f"bold shows no significant difference.")
JSON_FIELDS = ("algorithm_args", "switch_args", "wrappers", "server_optimizer_args",
               "probe_args", "switch_when")


class Cell(NamedTuple):
    row: str
    column: str
    seed: int
    config: ExperimentConfig
    setting: tuple = ()          # ((grid key, value), ...): the grid point this run trains


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
    for column, values in sweep["columns"].items():
        if isinstance(values, dict) and "transfer" in values:
            check_transfer(sweep, column, values["transfer"])
    pairs = sweep.get("compare", [])
    if not (isinstance(pairs, list) and all(isinstance(p, list) and len(p) == 2
                                            and set(p) <= set(sweep["columns"]) for p in pairs)):
        raise FljaxError(f"sweep 'compare' must be a list of [column, column] pairs of "
                         f"{sorted(sweep['columns'])}, got {pairs!r}")
    relative = sweep.get("cost_relative_to")
    if relative is not None and relative not in sweep["columns"]:
        raise FljaxError(f"sweep 'cost_relative_to' must name a column of "
                         f"{sorted(sweep['columns'])}, got {relative!r}")
    extend = sweep.get("extend", [])
    if not (isinstance(extend, list) and all(isinstance(k, str) for k in extend)):
        raise FljaxError(f"sweep 'extend' must be a list of grid keys, got {extend!r}")
    if not isinstance(sweep.get("bounds", {}), dict):
        raise FljaxError(f"sweep 'bounds' must be an object {{extend key: [low, high]}}, got "
                         f"{sweep['bounds']!r}")
    for key, bound in sweep.get("bounds", {}).items():
        if not (key in extend and isinstance(bound, list) and len(bound) == 2
                and all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in bound)
                and bound[0] < bound[1]):
            raise FljaxError(f"sweep 'bounds' must map an 'extend' key ({extend}) to "
                             f"[low, high] with low < high, got {key!r}: {bound!r}")
    if not isinstance(sweep.get("extend_jointly", False), bool):
        raise FljaxError(f"sweep 'extend_jointly' must be true or false, got "
                         f"{sweep['extend_jointly']!r}")
    for scale in [None, *sweep.get("scales", {})]:
        limit = max_extensions(sweep, scale)
        if not (isinstance(limit, int) and not isinstance(limit, bool) and limit >= 0):
            raise FljaxError(f"sweep {'' if scale is None else f'scale {scale!r} '}"
                             f"'max_extensions' must be an integer >= 0, got {limit!r}")
        hyperband.check(hyperband_options(sweep, scale))
        early_termination.check(early_termination_options(sweep, scale))
        if hyperband_options(sweep, scale) and early_termination_options(sweep, scale):
            raise FljaxError(f"sweep scale {scale!r} sets both 'hyperband' and "
                             f"'early_termination': choose one way to stop grid points early")
    if not isinstance(sweep.get("best_round", ""), str):
        raise FljaxError(f"sweep 'best_round' must be an evaluation key, got "
                         f"{sweep['best_round']!r}")
    return sweep


def at_best_round(evaluations: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """The evaluations up to the one with the largest ``key`` (the first such; all of them if no
    evaluation logs it, or the run diverged): its last record is the run's best round."""
    scored = [i for i, e in enumerate(evaluations) if key in e]
    if not scored or evaluations[-1].get("diverged"):
        return evaluations
    best = max(scored, key=lambda i: (evaluations[i][key], -i))
    return evaluations[:best + 1]


def reported(sweep: dict[str, Any], evaluations: list[dict[str, Any]]) -> dict[str, Any]:
    """The evaluation a run counts by: its last, or with the sweep's ``best_round`` its best
    round's (``at_best_round``)."""
    if "best_round" in sweep:
        evaluations = at_best_round(evaluations, sweep["best_round"])
    return evaluations[-1]


def grid_points(grid: dict[str, list]) -> list[tuple]:
    """Every point of ``grid`` ({key: [values]}) as ((key, value), ...), keys in order."""
    if not isinstance(grid, dict) or not all(isinstance(v, list) and v for v in grid.values()):
        raise FljaxError(f"a sweep 'grid' must be an object of key -> non-empty list of values, "
                         f"got {grid!r}")
    return [tuple(zip(grid, values)) for values in itertools.product(*grid.values())]


def with_setting(values: dict[str, Any], setting: tuple) -> dict[str, Any]:
    """``values`` with each (key, value) of ``setting`` set; 'field.a.b' sets a JSON field; a
    number for local_steps or local_epochs turns the other off (``one_local_work``)."""
    values = {**values, **one_local_work({key: value for key, value in setting if "." not in key})}
    for key, value in setting:
        field, *path = key.split(".")
        if not path:
            continue
        if field not in JSON_FIELDS:
            raise FljaxError(f"grid key {key!r}: only {list(JSON_FIELDS)} take a dotted path")
        current = values.get(field, {})
        tree = json.loads(current) if isinstance(current, str) else json.loads(json.dumps(current))
        node = tree
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
        values[field] = tree
    return values


def setting_slug(setting: tuple) -> str:
    return slug("_".join(f"{key.split('.')[-1]}={value}" for key, value in setting))


def cells(sweep: dict[str, Any], scale: str | None, out_dir: str,
          seeds: list[int] | None = None, rows: list[str] | None = None,
          transferred: dict[tuple, dict[str, Any]] | None = None, **changes) -> list[Cell]:
    """Every run of the sweep at ``scale`` (a key of its 'scales', or None for the base values),
    of its ``rows`` (default all), with ``changes`` (config values) applied last. A column that
    transfers values from another (``transfer``) is left out until ``transferred`` holds its
    (row, column)'s values (``transfers``)."""
    unknown = sorted(set(rows or ()) - set(sweep["rows"]))
    if unknown:
        raise FljaxError(f"rows {unknown} are not rows of the sweep; its rows are "
                         f"{list(sweep['rows'])}")
    scales = sweep.get("scales", {})
    if scale is not None and scale not in scales:
        raise FljaxError(f"scale must be one of {sorted(scales)}, got {scale!r}")
    overrides = scales.get(scale, {}) if scale is not None else {}
    names = set(sweep["rows"]) | set(sweep["columns"]) | {"base"}
    unknown = sorted(set(overrides) - names - {"target_accuracy", "hyperband",
                                               "early_termination", "max_extensions", "title"})
    if unknown:
        raise FljaxError(f"scale {scale!r} overrides unknown rows or columns {unknown}")
    result = []
    for row, row_values in sweep["rows"].items():
        if rows and row not in rows:
            continue
        row_values = dict(row_values)
        per_cell = row_values.pop("cells", {})
        if not isinstance(per_cell, dict) or set(per_cell) - set(sweep["columns"]):
            raise FljaxError(f"row {row!r}: 'cells' must be an object of column name -> values "
                             f"naming columns of the sweep ({list(sweep['columns'])}), got "
                             f"{per_cell!r}")
        for column, column_values in sweep["columns"].items():
            layers = [sweep.get("base", {}), overrides.get("base", {}), row_values,
                      overrides.get(row, {}), column_values, overrides.get(column, {}),
                      per_cell.get(column, {})]
            # A later layer overrides an earlier one, whichever name of a field each uses (its
            # local_steps turns an earlier local_epochs off, and vice versa); grids merge key by
            # key (a later level's key replaces that key's values, null drops it).
            merged, grid = {}, {}
            for layer in map(current_names, layers):
                grid.update(current_names(layer.get("grid", {})))
                merged.update(one_local_work({k: v for k, v in layer.items() if k != "grid"}))
            grid = {key: values for key, values in grid.items() if values is not None}
            if merged.pop("transfer", None) is not None:
                taken = (transferred or {}).get((row, column))
                if taken is None:
                    continue                    # waits for its source column's selection
                merged = with_setting(merged, tuple(sorted(taken.items())))
            for setting in grid_points(grid) if grid else [()]:
                for seed in seeds or sweep.get("seeds", [0]):
                    run_dir = os.path.join(out_dir, scale or "base", slug(row), slug(column),
                                           *([setting_slug(setting)] if setting else []),
                                           f"seed_{seed}")
                    values = {**with_setting(merged, setting), "seed": seed, "out_dir": run_dir,
                              **one_local_work(current_names(changes))}
                    try:
                        config = ExperimentConfig().replace(**values).validate()
                    except FljaxError as e:
                        raise FljaxError(f"sweep run {row!r} / {column!r}: {e}") from None
                    result.append(Cell(row, column, seed, config, setting))
    return result


def check_transfer(sweep: dict[str, Any], column: str, transfer: Any) -> None:
    """Raise FljaxError for a bad ``transfer`` of ``column`` (module doc)."""
    if not (isinstance(transfer, dict) and set(transfer) == {"from", "keys"}
            and isinstance(transfer["keys"], list) and transfer["keys"]
            and all(isinstance(k, str) for k in transfer["keys"])):
        raise FljaxError(f"column {column!r}: 'transfer' must be {{'from': a column, 'keys': "
                         f"[grid keys]}}, got {transfer!r}")
    others = sorted(set(sweep["columns"]) - {column})
    if transfer["from"] not in others:
        raise FljaxError(f"column {column!r} transfers from {transfer['from']!r}, which is not "
                         f"another column of the sweep ({others})")
    both = sorted(set(sweep["columns"][column].get("grid", {})) & set(transfer["keys"]))
    if both:
        raise FljaxError(f"column {column!r} both transfers and searches {both}: a key is one "
                         f"or the other")


def transfers(sweep: dict[str, Any], cell_list: list[Cell],
              results: dict[Cell, list]) -> dict[tuple, dict[str, Any]]:
    """{(row, column): {key: value}} for each column that transfers (``transfer``) from a source
    whose runs in that row are all in ``results``: the source's selected values of the keys."""
    found = {}
    for column, values in sweep["columns"].items():
        transfer = values.get("transfer")
        if transfer is None:
            continue
        for row in dict.fromkeys(c.row for c in cell_list):
            source = [c for c in cell_list if (c.row, c.column) == (row, transfer["from"])]
            if not source or any(c not in results for c in source):
                continue
            chosen = dict(selected(sweep, results, row, transfer["from"])[0])
            missing = [key for key in transfer["keys"] if key not in chosen]
            if missing:
                raise FljaxError(f"column {column!r} transfers {missing} from "
                                 f"{transfer['from']!r}, whose grid does not search them (it "
                                 f"searches {sorted(chosen)})")
            found[(row, column)] = {key: chosen[key] for key in transfer["keys"]}
    return found


def next_stage(sweep: dict[str, Any], scale: str | None, out_dir: str, cell_list: list[Cell],
               results: dict[Cell, list], transferred: dict[tuple, dict[str, Any]],
               seeds: list[int] | None = None, **changes) -> list[Cell]:
    """The cells of the columns that can start now: those whose source column's runs are all in
    ``results`` and that have not started (``transfer``); their values join ``transferred``."""
    new = {key: values for key, values in transfers(sweep, cell_list, results).items()
           if key not in transferred}
    transferred.update(new)
    return [c for c in cells(sweep, scale, out_dir, seeds, None, transferred, **changes)
            if (c.row, c.column) in new]


def all_stages(sweep: dict[str, Any], scale: str | None, out_dir: str,
               seeds: list[int] | None = None, **changes) -> list[Cell]:
    """The cells of every stage (the columns that ``transfer`` included), as if each source column
    selected its first grid point: what ``fljax sweep --plan`` estimates and what a check of every
    cell builds. The transferred values of a real run are its sources' selections."""
    cell_list, transferred = cells(sweep, scale, out_dir, seeds, **changes), {}
    key = sweep.get("selection", "val_accuracy")
    while True:
        tied = {c: [{"round": c.config.rounds, key: 0.0}] for c in cell_list}
        stage = next_stage(sweep, scale, out_dir, cell_list, tied, transferred, seeds, **changes)
        if not stage:
            return cell_list
        cell_list += stage


def restrict(sweep: dict[str, Any], rows: list[str] | None = None,
             columns: list[str] | None = None) -> dict[str, Any]:
    """The sweep with only ``rows`` and ``columns`` (None: all), its ``compare`` pairs and
    ``cost_relative_to`` kept where both sides remain (``fljax sweep --rows/--columns``)."""
    for key, names in (("rows", rows), ("columns", columns)):
        unknown = sorted(set(names or ()) - set(sweep[key]))
        if unknown:
            raise FljaxError(f"{key} {unknown} are not {key} of the sweep; its {key} are "
                             f"{list(sweep[key])}")
    kept = {**sweep}
    if rows:
        kept["rows"] = {r: v for r, v in sweep["rows"].items() if r in rows}
    if columns:
        kept["columns"] = {c: v for c, v in sweep["columns"].items() if c in columns}
        kept["compare"] = [p for p in sweep.get("compare", []) if set(p) <= set(columns)]
        if sweep.get("cost_relative_to") not in kept["columns"]:
            kept.pop("cost_relative_to", None)
    for column, values in kept["columns"].items():
        source = (values.get("transfer") or {}).get("from")
        if source is not None and source not in kept["columns"]:
            raise FljaxError(f"column {column!r} takes values from {source!r} (transfer): keep "
                             f"both columns")
    dropped = (set(sweep["rows"]) - set(kept["rows"])) | (set(sweep["columns"])
                                                          - set(kept["columns"]))
    kept["scales"] = {name: {key: value for key, value in scale.items() if key not in dropped}
                      for name, scale in sweep.get("scales", {}).items()}
    return kept


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


def parse_seeds(text: str) -> list[int]:
    """``"0-4,7"`` -> [0, 1, 2, 3, 4, 7]."""
    seeds = []
    for part in text.split(","):
        first, sep, last = part.strip().partition("-")
        try:
            seeds += list(range(int(first), int(last) + 1)) if sep else [int(first)]
        except ValueError:
            raise FljaxError(f"--seeds takes integers and ranges such as 0-9 or 0,3,5, got "
                             f"{text!r}") from None
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise FljaxError(f"--seeds must name distinct seeds >= 0, got {text!r}")
    return seeds


def parse_grid(settings: list[str]) -> dict[str, list]:
    """``["lr=0.05,0.1", "algorithm_args.mu=0.01"]`` -> {"lr": [0.05, 0.1], "algorithm_args.mu":
    [0.01]}: each value is read as JSON, or taken as a string if it is not JSON; commas inside
    brackets or braces belong to a value."""
    grid = {}
    for setting in settings:
        key, sep, text = setting.partition("=")
        if not sep or not key:
            raise FljaxError(f"--set takes KEY=VALUE[,VALUE...], got {setting!r}")
        values, depth, start = [], 0, 0
        for i, char in enumerate(text + ","):
            depth += (char in "[{") - (char in "]}")
            if char == "," and depth == 0:
                values.append(text[start:i])
                start = i + 1
        grid[key] = [parse_settings([f"{key}={v}"])[key] for v in values]
    return grid


def grid_cells(config: ExperimentConfig, seeds: list[int], grid: dict[str, list]) -> list[Cell]:
    """The runs of ``config`` at every point of ``grid`` for every seed, each in
    ``OUT_DIR/POINT/seed_S`` (``fljax --seeds 0-9 --set lr=0.05,0.1``)."""
    cells = []
    for setting in grid_points(grid) if grid else [()]:
        for seed in seeds:
            point = [setting_slug(setting)] if setting else []
            run_dir = os.path.join(config.run_dir(), *point, f"seed_{seed}")
            values = {**with_setting(config.to_dict(), setting), "seed": seed, "out_dir": run_dir}
            cells.append(Cell("run", setting_slug(setting) or "run", seed,
                              ExperimentConfig().replace(**values).validate(), setting))
    return cells


def run_grid(config: ExperimentConfig, seeds: list[int], grid: dict[str, list] | None = None,
             *, max_runs: int | None = None, memory_limit: int | None = None,
             progress: bool = True) -> dict[Cell, list]:
    """Train ``config`` at every point of ``grid`` ({config key: [values]}, dotted keys reach into
    JSON fields) for every seed, the runs that share a program together (``run_many``): from a
    notebook, what ``fljax --seeds ... --set KEY=V1,V2`` does. Returns each run's evaluations by
    cell (``grid_table`` tabulates them); each run writes to ``OUT_DIR/POINT/seed_S``."""
    from fljax.runner.train import run_many

    cell_list = grid_cells(config, list(seeds), dict(grid or {}))
    return run_sweep(cell_list, lambda configs: run_many(
        configs, progress=progress, memory_limit=memory_limit), max_runs or len(cell_list))


def grid_table(results: dict[Cell, list]) -> str:
    """Markdown: each grid point's final and best test accuracy (%), mean +- std over its seeds,
    with its validation accuracy where logged, and how many runs diverged."""
    points: dict[tuple, list] = {}
    for cell, evals in results.items():
        points.setdefault(cell.setting, []).append(evals)
    lines = ["| setting | seeds | final test accuracy | best test accuracy | final val accuracy |",
             "|---|---|---|---|---|"]
    for setting, runs in points.items():
        ok = [e for e in runs if e and not e[-1].get("diverged")]
        final = [100 * e[-1]["accuracy"] for e in ok]
        best = [100 * max(x["accuracy"] for x in e) for e in ok]
        val = [100 * e[-1]["val_accuracy"] for e in ok if "val_accuracy" in e[-1]]
        failed = len(runs) - len(ok)
        name = ", ".join(f"{k}={v}" for k, v in setting) or "-"
        lines.append(f"| {name} | {len(runs)}{f' ({failed} diverged)' if failed else ''} | "
                     f"{mean_std(final)} | {mean_std(best)} | {mean_std(val)} |")
    return "\n".join(lines)


def rounds_to(evaluations: list[dict[str, Any]], target: float) -> int | None:
    """The first evaluated round whose test accuracy reaches ``target``, or None."""
    cost = to_target(evaluations, target)
    return None if cost is None else cost["rounds"]


# (label, key of to_target's result, scale) of the cost-to-target lines
TARGET_COSTS = (("rounds", "rounds", 1.0), ("MB", "bytes", 1e-6), ("GFLOPs", "flops", 1e-9),
                ("seconds", "seconds", 1.0))


def run_sweep(cell_list: list[Cell],
              train: Callable[[list[ExperimentConfig]], list[list[dict[str, Any]] | Diverged]],
              max_runs: int = 1) -> dict[Cell, list]:
    """Run every cell, the cells that can share a compiled program (``fljax.runner.grouping``) in
    batches of at most ``max_runs``, with ``train(configs) -> each run's evaluations or its
    Diverged error``; their evaluations by cell. A run that diverges (NaN) is recorded as
    ``[{'round': R, 'diverged': True}]``: its grid point loses the selection, and the table
    counts it."""
    groups = group([cell.config for cell in cell_list], max_runs)
    results = {}
    for i, members in enumerate(groups):
        first = cell_list[members[0]]
        what = (f"{first.row} / {first.column} / seed {first.seed}" if len(members) == 1 else
                f"{len(members)} runs in one program: " + ", ".join(sorted(
                    {f"{cell_list[m].row} / {cell_list[m].column}" for m in members})))
        print(f"[{i + 1}/{len(groups)}] {what}", flush=True)
        for m, outcome in zip(members, train([cell_list[m].config for m in members])):
            cell = cell_list[m]
            if isinstance(outcome, Diverged):
                print(f"    {cell.row} / {cell.column} / seed {cell.seed}: diverged at round "
                      f"{outcome.round}", flush=True)
                outcome = [{"round": outcome.round, "diverged": True}]
            results[cell] = outcome
    return results


def max_extensions(sweep: dict[str, Any], scale: str | None) -> Any:
    """How many times the tuning rule may extend a grid at ``scale``: the scale's own
    ``max_extensions``, else the sweep's, else ``MAX_EXTENSIONS``."""
    return sweep.get("scales", {}).get(scale, {}).get(
        "max_extensions", sweep.get("max_extensions", MAX_EXTENSIONS))


def extend_grids(sweep: dict[str, Any], scale: str | None, cell_list: list[Cell],
                 results: dict[Cell, Any], run: Callable[[list[Cell]], dict[Cell, Any]]
                 ) -> list[Cell]:
    """The tuning rule's loop: while a cell's selected value of an ``extend`` key sits at its
    grid's edge, and at most ``max_extensions(sweep, scale)`` times, ``run`` trains the runs
    ``extensions`` adds and returns their results, which go into ``results``. Returns
    ``cell_list`` with those runs."""
    for _ in range(max_extensions(sweep, scale)):
        more = extensions(sweep, cell_list, results)
        if not more:
            break
        cell_list = cell_list + more
        results.update(run(more))
    return cell_list


def hyperband_options(sweep: dict[str, Any], scale: str | None) -> dict[str, Any] | None:
    """The Hyperband options of a scale: its own ``hyperband`` entry, else the sweep's."""
    return sweep.get("scales", {}).get(scale, {}).get("hyperband", sweep.get("hyperband"))


def early_termination_options(sweep: dict[str, Any], scale: str | None) -> dict[str, Any] | None:
    """The early-termination options of a scale: its own ``early_termination``, else the
    sweep's."""
    return sweep.get("scales", {}).get(scale, {}).get("early_termination",
                                                        sweep.get("early_termination"))


def stopped(evaluations: list[dict[str, Any]]) -> bool:
    """Whether a run diverged or was stopped early (``fljax.runner.hyperband``)."""
    return bool(evaluations) and bool(evaluations[-1].get("diverged")
                                      or evaluations[-1].get("pruned"))


def selected(sweep: dict[str, Any], results: dict[Cell, list], row: str,
             column: str) -> tuple[tuple, list[list]]:
    """(the grid point of the cell with the best mean ``selection`` score over seeds, the
    evaluations of that point's runs, by seed order). Without a grid: ((), every run). A run's
    score is that of its reported evaluation (``reported``: its last, or with ``best_round`` its
    best round's), so the table, the tuning rule's extensions, ``runs.csv``'s selected flag and
    a transfer all select the same point."""
    runs: dict[tuple, list] = {}
    for cell, evals in results.items():
        if cell.row == row and cell.column == column and evals:
            runs.setdefault(cell.setting, []).append((cell.seed, evals))
    if not runs:
        return (), []
    key = sweep.get("selection", "val_accuracy")
    if len(runs) > 1:
        missing = [s for s, r in runs.items()
                   if any(key not in e[-1] and not stopped(e) for _, e in r)]
        if missing:
            raise FljaxError(f"sweep cell {row!r} / {column!r} has a grid but its runs have no "
                             f"{key!r} to select on: set validation_fraction > 0 (a split held "
                             f"out of the training data; never select on the test set)")

    def score(setting):      # a point with a diverged seed, or stopped early, never wins
        if any(stopped(e) for _, e in runs[setting]):
            return float("-inf")
        finals = [reported(sweep, e) for _, e in runs[setting]]
        return statistics.mean(f.get(key, 0.0) for f in finals)

    best = max(runs, key=score)
    return best, [evals for _, evals in sorted(runs[best], key=lambda r: r[0])]


def extensions(sweep: dict[str, Any], cell_list: list[Cell],
               results: dict[Cell, list]) -> list[Cell]:
    """The runs the tuning rule adds: for each (row, column) whose selected value of an
    ``extend`` key is the smallest or largest of the (positive) values its grid tried, the runs of
    the next value beyond that edge, v_edge^2 / v_neighbour (clipped to the key's ``bounds``;
    none where the edge is the bound), at the selected point's other values
    and with every seed of the cell. With ``extend_jointly``: the runs of every untried point of
    the selected point's neighbourhood, the product over the ``extend`` keys of {the value tried
    below, the selected value, the value tried above} (past an edge: v_edge^2 / v_neighbour)."""
    by_cell: dict[tuple, list[Cell]] = {}
    for cell in cell_list:
        by_cell.setdefault((cell.row, cell.column), []).append(cell)
    jointly = sweep.get("extend_jointly", False)
    added = []
    for (row, column), members in by_cell.items():
        best = dict(selected(sweep, results, row, column)[0])
        choices = {}                  # extend key -> the values its neighbourhood takes
        for key in sweep.get("extend", []):
            tried = sorted({dict(c.setting)[key] for c in members if key in dict(c.setting)})
            if len(tried) < 2 or key not in best or tried[0] <= 0:
                continue
            low, high = sweep.get("bounds", {}).get(key, (-math.inf, math.inf))
            choices[key] = [min(max(v, low), high)
                            for v in neighbours(tried, best[key], all_of_them=jointly)]
        if not choices:
            continue
        if jointly:
            points = [dict(best, **dict(zip(choices, values)))
                      for values in itertools.product(*choices.values())]
        else:
            points = [dict(best, **{key: value}) for key, values in choices.items()
                      for value in values if value != best[key]]
        tried_points = {c.setting for c in members}
        template = [c for c in members if dict(c.setting) == best]
        for point in points:
            setting = tuple((k, point[k]) for k, _ in template[0].setting)
            if setting not in tried_points:
                tried_points.add(setting)
                added += [at_setting(c, setting) for c in template]
    return added


def neighbours(tried: list[float], value: float, all_of_them: bool) -> list[float]:
    """The values a selected ``value`` of the sorted positive ``tried`` values leads to: past an
    edge, the next geometric step v_edge^2 / v_neighbour; with ``all_of_them``, also the values
    tried just below and above it (and ``value`` itself)."""
    i = tried.index(value)
    below = tried[i - 1] if i > 0 else float(f"{value * value / tried[1]:.6g}")
    above = tried[i + 1] if i < len(tried) - 1 else float(f"{value * value / tried[-2]:.6g}")
    if all_of_them:
        return [below, value, above]
    return [below] if i == 0 else [above] if i == len(tried) - 1 else []


def at_setting(cell: Cell, setting: tuple) -> Cell:
    """``cell`` moved to another grid point: its config with ``setting``, in that point's
    directory beside its own."""
    fields = {key.split(".")[0] for key, _ in setting}
    values = with_setting({f: getattr(cell.config, f) for f in fields}, setting)
    run_dir = os.path.join(os.path.dirname(os.path.dirname(cell.config.out_dir)),
                           setting_slug(setting), f"seed_{cell.seed}")
    return cell._replace(config=cell.config.replace(**values, out_dir=run_dir).validate(),
                         setting=setting)


def at_edge(sweep: dict[str, Any], results: dict[Cell, list], row: str, column: str,
            setting: tuple) -> bool:
    """Whether a value of an ``extend`` key in ``setting`` is an edge of the values tried (a
    value at the key's ``bounds`` is not: nothing lies beyond it)."""
    for key, value in setting:
        if key in sweep.get("extend", []):
            tried = {dict(c.setting).get(key) for c in results
                     if (c.row, c.column) == (row, column)}
            bound = sweep.get("bounds", {}).get(key, ())
            if len(tried) > 1 and value in (min(tried), max(tried)) and value not in bound:
                return True
    return False


def late_gain(evaluations: list[dict[str, Any]], key: str, fraction: float = 0.25) -> float | None:
    """The rise of ``key`` over the last ``fraction`` of a run: its value at the last evaluation
    minus at the evaluation nearest round (1 - fraction) * last round (None if not logged)."""
    logged = [e for e in evaluations if key in e]
    if len(logged) < 2 or evaluations[-1].get("diverged"):
        return None
    start = (1 - fraction) * logged[-1]["round"]
    earlier = min(logged[:-1], key=lambda e: abs(e["round"] - start))
    return logged[-1][key] - earlier[key]


def heading(sweep: dict[str, Any], scale: str | None, configs: list[ExperimentConfig],
            default_title: str = "sweep") -> str:
    """The first line of a sweep's ``results.md``: the scale's own ``title`` if it has one, else
    the sweep's; the scale; and the data and models its runs trained on (read from their
    configs, so that the table never names data it did not run)."""
    title = sweep.get("scales", {}).get(scale, {}).get("title",
                                                       sweep.get("title", default_title))
    data = ", ".join(sorted({c.dataset for c in configs}))
    models = ", ".join(sorted({c.model for c in configs}))
    ran = f"; data: {data}; model: {models}" if configs else ""
    return f"{title} (scale: {scale or 'base'}{ran})"


def results_markdown(sweep: dict[str, Any], results: dict[Cell, list], scale: str | None,
                     configs: list[ExperimentConfig], default_title: str = "sweep") -> str:
    """The text of a sweep's ``results.md``: ``heading``, ``table`` and the bold rule."""
    return (heading(sweep, scale, configs, default_title) + "\n\n"
            + table(sweep, results, scale) + f"\n\n{BOLD_RULE}")


def table(sweep: dict[str, Any], results: dict[Cell, list], scale: str | None = None) -> str:
    """Markdown: final (with ``best_round``: best-round) test accuracy (%) of each cell (a line
    per row and metric, if the sweep names ``metrics``) as mean +- std over seeds, the best of a
    line in bold where it beats the runner-up significantly (``clear_winner``: paired over
    seeds, p < 0.05; no bold: no significant difference); for a grid, the point selected on the
    validation split (a line per row) and its test scores; if the sweep sets a target accuracy, lines of rounds, MB, GFLOPs and seconds to reach it (mean over seeds; x
    where some seed never reached it); and the paired differences the sweep's ``compare`` asks
    for."""
    columns = list(sweep["columns"])
    target = sweep.get("scales", {}).get(scale, {}).get("target_accuracy",
                                                        sweep.get("target_accuracy"))
    whole_runs = results
    if "best_round" in sweep:
        results = {cell: at_best_round(evals, sweep["best_round"])
                   for cell, evals in results.items()}
    lines = ["| setting | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    chosen = {(row, column): selected(sweep, results, row, column)
              for row in sweep["rows"] for column in columns}
    for row in sweep["rows"]:
        runs = [chosen[row, column][1] for column in columns]
        seeds = [sorted(c.seed for c, e in results.items() if e and (c.row, c.column, c.setting)
                        == (row, column, chosen[row, column][0])) for column in columns]
        if any(chosen[row, column][0] for column in columns):
            lines.append(f"| {row}: selected on {sweep.get('selection', 'val_accuracy')} | "
                         + " | ".join((", ".join(f"{k.split('.')[-1]}={v}"
                                                 for k, v in chosen[row, column][0]) or "-")
                                      + (" (grid edge)" if at_edge(sweep, results, row, column,
                                                                   chosen[row, column][0])
                                         else "")
                                      for column in columns) + " |")
        for label, keys in sweep.get("metrics", {"": "accuracy"}).items():
            keys = [keys] if isinstance(keys, str) else keys
            scale_of = 100 if "acc" in keys[0] else 1       # accuracies in %
            finals = [[scale_of * evals[-1][first_logged(evals[-1], keys)] for evals in r
                       if first_logged(evals[-1], keys) in evals[-1]]
                      for r in runs]                    # '-' where a column does not log it
            failed = [sum(bool(evals[-1].get("diverged")) for evals in r) for r in runs]
            cells_text = [mean_std(f) + (f" ({k} of {len(r)} diverged)" if k else "")
                          for f, k, r in zip(finals, failed, runs)]
            if "acc" in keys[0]:     # the best: the highest accuracy, the lowest spread
                by_seed = [{seed: scale_of * evals[-1][first_logged(evals[-1], keys)]
                            for seed, evals in zip(s, r)
                            if first_logged(evals[-1], keys) in evals[-1]}
                           for s, r in zip(seeds, runs)]
                best = clear_winner(by_seed, -1.0 if keys[0].endswith("_std") else 1.0)
                if best is not None:
                    cells_text[best] = f"**{cells_text[best]}**"
            name = f"{row}: {label}" if label else row
            lines.append(f"| {name} | " + " | ".join(cells_text) + " |")
        if "extend" in sweep:
            lines.append(gain_line(sweep, whole_runs, row, chosen))
        if "cost_relative_to" in sweep:
            lines += relative_costs(sweep, whole_runs, row, chosen)
        if target is not None:
            reach = [[to_target(evals, target) for evals in r] for r in runs]
            for label, key, factor in TARGET_COSTS:
                lines.append(f"| {row}: {label} to {100 * target:g}% | " + " | ".join(
                    "x" if not hit or None in hit else
                    f"{statistics.mean(factor * h[key] for h in hit):.3g}"
                    for hit in reach) + " |")
    pairs = sweep.get("compare", [])
    for label, keys in (sweep.get("metrics", {"test accuracy": "accuracy"})
                        if pairs else {}).items():
        keys = [keys] if isinstance(keys, str) else keys
        factor = 100 if "acc" in keys[0] else 1

        def values(row, column):
            return [factor * e[-1][first_logged(e[-1], keys)] for e in chosen[row, column][1]
                    if first_logged(e[-1], keys) in e[-1]]

        lines += ["", f"| paired difference of {label or keys[0]}"
                  f"{' (points)' if factor == 100 else ''} | " + " | ".join(sweep["rows"])
                  + " |", "|---|" + "---|" * len(sweep["rows"])]
        for a, b in pairs:
            lines.append(f"| {a} - {b} | " + " | ".join(
                paired_difference(values(row, a), values(row, b)) for row in sweep["rows"])
                + " |")
    return "\n".join(lines)


def gain_line(sweep: dict[str, Any], whole_runs: dict[Cell, list], row: str,
              chosen: dict) -> str:
    """A table line: at each column's selected point, the ``selection`` score's rise over the
    last 25% of the rounds (``late_gain``), mean +- std over seeds (points for accuracies)."""
    key = sweep.get("selection", "val_accuracy")
    factor = 100 if "acc" in key else 1
    texts = []
    for column in sweep["columns"]:
        setting = chosen[row, column][0]
        gains = [late_gain(e, key) for cell, e in whole_runs.items()
                 if (cell.row, cell.column, cell.setting) == (row, column, setting)]
        texts.append(mean_std([factor * g for g in gains if g is not None]))
    return f"| {row}: {key} gain, last 25% of rounds | " + " | ".join(texts) + " |"


def logged_keys(sweep: dict[str, Any]) -> list[str]:
    """The evaluation keys a sweep's results files keep: the test accuracy, the selection score
    and every key its ``metrics`` name."""
    keys = ["accuracy", sweep.get("selection", "val_accuracy")]
    for value in sweep.get("metrics", {}).values():
        keys += [value] if isinstance(value, str) else value
    return list(dict.fromkeys(keys))


def results_csv(sweep: dict[str, Any], results: dict[Cell, list]) -> tuple[str, str]:
    """Two small CSV texts for reports: ``runs`` (every run's reported evaluation, ``reported``:
    row, column, setting, seed, whether its grid point is the selected one, round, diverged, the
    ``logged_keys``) and ``curves`` (every evaluation of the selected points' runs)."""
    keys = logged_keys(sweep)
    header = ["row", "column", "setting", "seed", "selected", "round", "diverged", *keys]
    chosen = {(cell.row, cell.column): selected(sweep, results, cell.row, cell.column)[0]
              for cell in results}
    texts = []
    for every in (False, True):
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(header)
        for cell, evals in results.items():
            best = chosen[cell.row, cell.column] == cell.setting
            if every and not best:
                continue
            for e in (evals if every else [reported(sweep, evals)]):
                writer.writerow([cell.row, cell.column,
                                 "; ".join(f"{k}={v}" for k, v in cell.setting), cell.seed,
                                 int(best), e.get("round"), int(bool(e.get("diverged"))),
                                 *(f"{e[k]:.6g}" if isinstance(e.get(k), (int, float)) else ""
                                   for k in keys)])
        texts.append(out.getvalue())
    return texts[0], texts[1]


def relative_costs(sweep: dict[str, Any], whole_runs: dict[Cell, list], row: str,
                   chosen: dict) -> list[str]:
    """Table lines: each column's total bytes and FLOPs over its whole runs (of the selected grid
    point; mean over seeds) as a multiple of column ``cost_relative_to``'s."""
    def total(column, key):
        setting = chosen[row, column][0]
        values = [e[-1][key] for cell, e in whole_runs.items()
                  if (cell.row, cell.column, cell.setting) == (row, column, setting)
                  and key in e[-1]]
        return statistics.mean(values) if values else None

    reference = sweep["cost_relative_to"]
    lines = []
    for label, key in (("bytes", "bytes"), ("FLOPs", "total_flops")):
        base = total(reference, key)
        ratios = [total(column, key) for column in sweep["columns"]]
        lines.append(f"| {row}: {label} / {reference} | " + " | ".join(
            "-" if r is None or not base else f"{r / base:.2f}x" for r in ratios) + " |")
    return lines


def first_logged(record: dict[str, Any], keys: list[str]) -> str:
    """The first of ``keys`` that an evaluation record holds (the last one if none does)."""
    return next((key for key in keys if key in record), keys[-1])


def clear_winner(values: list[dict[int, float]], sign: float = 1.0) -> int | None:
    """The index of the best of ``values`` (each column's values by seed; the highest mean, or
    the lowest with ``sign`` -1) if it beats the runner-up significantly: a two-sided paired
    t-test over the seeds both ran, at least 2 of them, gives p < SIGNIFICANCE (a gain the same
    on every seed counts as significant); None otherwise, or with fewer than two columns."""
    ranked = sorted((j for j, v in enumerate(values) if v),
                    key=lambda j: -sign * statistics.mean(values[j].values()))
    if len(ranked) < 2:
        return None
    best, second = ranked[:2]
    seeds = sorted(values[best].keys() & values[second].keys())
    a, b = [values[best][s] for s in seeds], [values[second][s] for s in seeds]
    diff = [sign * (x - y) for x, y in zip(a, b)]
    if len(seeds) < 2 or statistics.mean(diff) <= 0:
        return None
    if statistics.stdev(diff) == 0:
        return best
    return best if scipy.stats.ttest_rel(a, b).pvalue < SIGNIFICANCE else None


def paired_difference(a: list[float], b: list[float]) -> str:
    """mean +- std over seeds of a - b, and the two-sided p-value of a paired t-test."""
    if len(a) != len(b) or not a:
        return "-"
    diff = [x - y for x, y in zip(a, b)]
    if len(diff) < 2:
        return f"{diff[0]:+.2f} (1 seed)"
    p = scipy.stats.ttest_rel(a, b).pvalue if statistics.stdev(diff) > 0 else float("nan")
    return f"{statistics.mean(diff):+.2f} ± {statistics.stdev(diff):.2f} (p = {p:.2g}, n = {len(diff)})"


def mean_std(values: list[float]) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"
