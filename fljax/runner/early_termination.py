"""Early termination of a sweep's weak grid points, as FedGA's appendix B.2 tunes its baselines.

Dandi, Barba, Jaggi, "Implicit Gradient Alignment in Distributed and Federated Learning" (AAAI
2022), appendix B.2: "During training, we terminated the experiments with a significantly lower
validation accuracy after 20% of the rounds." In a sweep file (or a scale),
``"early_termination": {"fraction": f, "margin": m}`` does this per cell (row x column): every grid
point trains to round

    r0 = eval_every * ceil(f * rounds / eval_every)

(the first evaluation at or after a fraction f of the cell's rounds), where each point's score is
the mean over seeds of the validation score (the sweep's ``selection``). A point whose score is
below the best point's by more than m (in the score's units: 0.05 is 5 accuracy points), or where
a seed diverged, stops at r0 and can never be selected; the others train to the end. The paper
does not quantify "significantly lower": the margin is the sweep file's, stated there. All the
cells' points train to r0 together and the survivors on together, so batching is kept; a sweep
run again resumes every run from its checkpoints and replays the decisions.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Callable

from fljax.errors import FljaxError
from fljax.runner.hyperband import stored_or_run


def check(options: dict[str, Any] | None) -> None:
    """Raise FljaxError for a bad ``early_termination`` entry of a sweep file (None: none)."""
    if options is None:
        return
    if not isinstance(options, dict) or set(options) != {"fraction", "margin"}:
        raise FljaxError(f"sweep 'early_termination' must be an object with fraction and margin, "
                         f"got {options!r}")
    fraction, margin = options["fraction"], options["margin"]
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) \
            or not 0 < fraction < 1:
        raise FljaxError(f"early_termination fraction must lie in (0, 1), got {fraction!r}")
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not margin >= 0 \
            or math.isinf(margin):
        raise FljaxError(f"early_termination margin must be a finite number >= 0, got "
                         f"{margin!r}")


def termination_round(rounds: int, eval_every: int, fraction: float) -> int:
    """r0 = eval_every * ceil(fraction * rounds / eval_every)."""
    return eval_every * math.ceil(fraction * rounds / eval_every)


def run_terminated(cell_list: list, run: Callable[[list], dict], options: dict[str, Any],
                   selection: str = "val_accuracy") -> dict:
    """The evaluations of every cell (``fljax.runner.sweep.Cell``) with each (row, column)'s weak
    grid points stopped at r0 (module doc). ``run(cells) -> {cell: evaluations}`` trains cells to
    their config's rounds, resuming from checkpoints. A stopped point's runs end with a record
    ``{'round': r0, 'pruned': True}``."""
    def r0_of(cell) -> int:
        return termination_round(cell.config.rounds, cell.config.eval_every, options["fraction"])

    early = [c for c in cell_list if r0_of(c) < c.config.rounds]
    short = {c: c._replace(config=c.config.replace(rounds=r0_of(c))) for c in early}
    trained = stored_or_run(list(short.values()), run) if short else {}
    points: dict[tuple, dict[tuple, list]] = {}
    for cell in early:
        points.setdefault((cell.row, cell.column), {}).setdefault(cell.setting, []).append(cell)
    results, survivors = {}, [c for c in cell_list if c not in short]
    for (row, column), by_setting in points.items():
        scores = {}
        for setting, cells in by_setting.items():
            evaluations = [trained[short[c]] for c in cells]
            if any(e and e[-1].get("diverged") for e in evaluations):
                results.update(zip(cells, evaluations))
                continue
            at_r0 = [next((r for r in e if r.get("round") == r0_of(c) and selection in r), None)
                     for c, e in zip(cells, evaluations)]
            if any(r is None for r in at_r0):
                raise FljaxError(f"early_termination needs {selection!r} at round "
                                 f"{r0_of(cells[0])} of {row!r} / {column!r}: set "
                                 f"validation_fraction > 0")
            scores[setting] = statistics.mean(r[selection] for r in at_r0)
        best = max(scores.values(), default=None)
        for setting, score in scores.items():
            cells = by_setting[setting]
            if score < best - options["margin"]:
                r0 = r0_of(cells[0])
                results.update((c, [r for r in trained[short[c]] if r.get("round", 0) <= r0]
                                + [{"round": r0, "pruned": True}]) for c in cells)
                print(f"    {row} / {column} / {dict(setting)}: stopped at round {r0}, "
                      f"{score:.4f} against the best {best:.4f} (early termination)",
                      flush=True)
            else:
                survivors += cells
    if survivors:
        results.update(run(survivors))
    return results
