"""Early stopping of a sweep's grid points: Hyperband, as Optuna's HyperbandPruner runs it.

FedDecay (Anonymous, 2023; section 4, Table 2) searches its grids "leveraging early termination and
hyperband stopping": a grid point whose validation accuracy falls behind the others' at a rung
stops there. In a sweep file, ``"hyperband": {"min_rounds": R, "reduction_factor": eta}`` (the
sweep's, or a scale's own) does this per cell (row x column): each grid point is one trial of an Optuna study (its runs, one per
seed, train together), and its rungs are the rounds R, R eta, R eta^2, ... below the cell's
``rounds`` (each rounded up to a multiple of ``eval_every``). At each rung the trial reports the
mean over seeds of the validation score (the sweep's ``selection``) and Optuna's HyperbandPruner
(its brackets and successive halving, ``min_resource=R``, ``max_resource=rounds``) says whether it
stops. A stopped point's runs end at that rung and can never be selected; the others train to the
end. The decisions are a function of the reported scores, the trials' order and the cell's name,
so a sweep run again (every run resumed from its checkpoints, nothing retrained) replays them.
"""

from __future__ import annotations

import math
import os
import statistics
from typing import Any, Callable

from fljax.errors import FljaxError


def check(options: dict[str, Any] | None) -> None:
    """Raise FljaxError for a bad ``hyperband`` entry of a sweep file (None: none)."""
    if options is None:
        return
    if not isinstance(options, dict) or set(options) - {"min_rounds", "reduction_factor"}:
        raise FljaxError(f"sweep 'hyperband' must be an object with min_rounds and optionally "
                         f"reduction_factor, got {options!r}")
    min_rounds, eta = options.get("min_rounds"), options.get("reduction_factor", 3)
    if not isinstance(min_rounds, int) or isinstance(min_rounds, bool) or min_rounds < 1:
        raise FljaxError(f"hyperband min_rounds must be an integer >= 1, got {min_rounds!r}")
    if not isinstance(eta, int) or isinstance(eta, bool) or eta < 2:
        raise FljaxError(f"hyperband reduction_factor must be an integer >= 2, got {eta!r}")


def rungs(min_rounds: int, reduction_factor: int, rounds: int, eval_every: int) -> list[int]:
    """min_rounds * eta^k below ``rounds``, each rounded up to a multiple of ``eval_every``,
    then ``rounds``."""
    points, k = [], 0
    while min_rounds * reduction_factor ** k < rounds:
        point = math.ceil(min_rounds * reduction_factor ** k / eval_every) * eval_every
        if point < rounds and point not in points:
            points.append(point)
        k += 1
    return points + [rounds]


def run_pruned(cell_list: list, run: Callable[[list], dict], options: dict[str, Any],
               selection: str = "val_accuracy") -> dict:
    """The evaluations of every cell (``fljax.runner.sweep.Cell``), each (row, column)'s grid points
    searched with Hyperband (module doc). ``run(cells) -> {cell: evaluations}`` trains cells to
    their config's rounds (resuming from checkpoints), as ``fljax.runner.sweep.run_sweep``. A stopped
    point's runs end with a record ``{'round': R, 'pruned': True}``."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    eta = options.get("reduction_factor", 3)
    cells_of: dict[tuple, dict[tuple, list]] = {}
    for cell in cell_list:
        cells_of.setdefault((cell.row, cell.column), {}).setdefault(cell.setting, []).append(cell)
    results = {}
    for (row, column), points in cells_of.items():
        rounds = max(c.config.rounds for cells in points.values() for c in cells)
        study = optuna.create_study(
            study_name=f"{row} / {column}", direction="maximize",
            pruner=optuna.pruners.HyperbandPruner(min_resource=options["min_rounds"],
                                                  max_resource=rounds, reduction_factor=eta))
        for setting, cells in points.items():
            trial = study.ask()
            eval_every = cells[0].config.eval_every
            for rung in rungs(options["min_rounds"], eta, rounds, eval_every):
                short = [c._replace(config=c.config.replace(rounds=rung)) for c in cells]
                trained = stored_or_run(short, run)
                evaluations = [trained[c] for c in short]
                if any(e and e[-1].get("diverged") for e in evaluations):
                    study.tell(trial, state=optuna.trial.TrialState.FAIL)
                    results.update(zip(cells, evaluations))
                    break
                at_rung = [next((r for r in e if r.get("round") == rung and selection in r), None)
                           for e in evaluations]
                if any(r is None for r in at_rung):
                    raise FljaxError(f"hyperband needs {selection!r} at round {rung} of "
                                     f"{row!r} / {column!r}: set validation_fraction > 0")
                score = statistics.mean(r[selection] for r in at_rung)
                trial.report(score, rung)
                if rung < rounds and trial.should_prune():
                    study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                    results.update((c, [r for r in e if r.get("round", 0) <= rung]
                                    + [{"round": rung, "pruned": True}])
                                   for c, e in zip(cells, evaluations))
                    print(f"    {row} / {column} / {dict(setting)}: stopped at round {rung} "
                          f"(hyperband)", flush=True)
                    break
                if rung == rounds:
                    study.tell(trial, score)
                    results.update(zip(cells, evaluations))
    return results


def stored_or_run(cells: list, run: Callable[[list], dict]) -> dict:
    """``run(cells)``, except for the cells whose run directory already holds more rounds than
    they ask (a sweep run again, past this rung): their logged evaluations up to their rounds,
    read without touching the directory."""
    from fljax.runner.logs import read_log
    from fljax.runner.train import rounds_held

    ahead = [c for c in cells if rounds_held(c.config) > c.config.rounds]
    results = {c: [r for r in read_log(os.path.join(c.config.run_dir(), "metrics.jsonl"))
                   if r.get("kind") == "eval" and r["round"] <= c.config.rounds] for c in ahead}
    rest = [c for c in cells if c not in results]
    return {**results, **(run(rest) if rest else {})}
