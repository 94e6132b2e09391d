"""Accuracy against simulated time: experiments/evidence_time.json (MNIST-1D, non-IID) and
experiments/evidence_time_natural.json (1,000 natural users), under heavy-tailed client speeds.

    python experiments/time_curves.py [--runs runs]   # writes the natural users' data if absent,
                                                     # runs both sweeps (resumable), then the
                                                     # table and the plot

Outputs, in experiments/results/time/: time.md and time.png.

Equal simulated time: a task's budget B is the smallest final simulated time over all its runs
(every run covers it). A run's accuracy at time b is that of its last evaluation at or before b.
The table gives each column's accuracy at B/4, B/2 and B (mean ± std over 10 seeds), its paired
difference to synchronous FedAvg at B, and the simulated time at which it first reaches FedAvg's
mean accuracy at B (over the seeds that reach it). The verdict names the column with the best
accuracy at B and the one that reaches FedAvg's accuracy soonest.
"""

from __future__ import annotations

import os

import numpy as np

from evidence_runs import HERE, evaluations, report
from fljax.runner.sweep import load_sweep, paired_difference

SWEEPS = ("evidence_time.json", "evidence_time_natural.json")
RESULTS = os.path.join(HERE, "results", "time")
BASELINE = "FedAvg"


def accuracy_at(evals: list[dict], time: float) -> float:
    """Test accuracy (%) of the last evaluation at or before simulated ``time`` (NaN before the
    first)."""
    before = [e for e in evals if e["sim_time"] <= time]
    return 100 * before[-1]["accuracy"] if before else float("nan")


def time_to(evals: list[dict], target: float) -> float | None:
    """Simulated time of the first evaluation with test accuracy >= target (%)."""
    return next((e["sim_time"] for e in evals if 100 * e["accuracy"] >= target), None)


def task(name: str, runs_dir: str):
    """(table lines, {column: (times, mean accuracy)}, verdict lines) of one sweep file."""
    sweep = load_sweep(os.path.join(HERE, name))
    (row,), seeds, columns = list(sweep["rows"]), sweep["seeds"], list(sweep["columns"])
    runs = {c: [evaluations(runs_dir, name, row, c, s) for s in seeds] for c in columns}
    budget = min(r[-1]["sim_time"] for c in columns for r in runs[c])
    at = {c: {f: [accuracy_at(r, f * budget) for r in runs[c]] for f in (0.25, 0.5, 1.0)}
          for c in columns}
    target = float(np.mean(at[BASELINE][1.0]))
    fmt = lambda v: f"{np.mean(v):.2f} ± {np.std(v, ddof=1):.2f}"
    lines = [f"### {row}", "", f"Budget B = {budget:.0f} time units (the shortest run's end); "
             f"target: FedAvg's mean accuracy at B, {target:.2f} %.", "",
             "| column | rounds (server steps) | mean time per round | accuracy % at B/4 | at B/2 "
             "| at B | - FedAvg at B (paired, points) | time to FedAvg's accuracy at B | seeds "
             "reaching it |", "|---|---|---|---|---|---|---|---|---|"]
    reach, curves = {}, {}
    for c in columns:
        rounds = runs[c][0][-1]["round"]
        per_round = np.mean([r[-1]["sim_time"] / r[-1]["round"] for r in runs[c]])
        hits = [t for t in (time_to(r, target) for r in runs[c]) if t is not None]
        reach[c] = (np.mean(hits) if hits else np.inf, len(hits))
        diff = "-" if c == BASELINE else paired_difference(at[c][1.0], at[BASELINE][1.0])
        lines.append(f"| {c} | {rounds} | {per_round:.1f} | {fmt(at[c][0.25])} | "
                     f"{fmt(at[c][0.5])} | {fmt(at[c][1.0])} | {diff} | "
                     f"{fmt(hits) if len(hits) > 1 else '-'} | {len(hits)}/{len(seeds)} |")
        grid = np.linspace(0, budget, 60)
        curves[c] = (grid, np.nanmean([[accuracy_at(r, t) for t in grid] for r in runs[c]],
                                      axis=0))    # where some seed has evaluated
    best = max(columns, key=lambda c: np.mean(at[c][1.0]))
    every = {c: t for c, (t, n) in reach.items() if n == len(seeds)}
    gain = "" if best == BASELINE else (
        f", {paired_difference(at[best][1.0], at[BASELINE][1.0])} over FedAvg")
    verdict = [f"{row}: best accuracy at equal simulated time B: **{best}** "
               f"({fmt(at[best][1.0])} %){gain}."]
    if every:
        fastest = min(every, key=every.get)
        verdict.append(f"{row}: **{fastest}** reaches FedAvg's accuracy at B in every seed "
                       f"soonest, at {every[fastest]:.0f} time units "
                       f"({every[fastest] / budget:.2f} B).")
    return lines, curves, verdict


def draw(ax, curves) -> None:
    """Mean test accuracy against simulated time, one line per column."""
    for i, (column, (times, acc)) in enumerate(curves.items()):
        ax.plot(times, acc, label=column, color=f"C{i}",
                linewidth=2 if column == BASELINE else 1.2)
    ax.set_xlabel("simulated time (clock units)")
    ax.set_ylabel("test accuracy % (mean of 10 seeds)")


if __name__ == "__main__":
    report(__doc__.splitlines()[0], SWEEPS, task,
           "Stragglers and asynchrony: accuracy against simulated time", "time_curves.py",
           os.path.join(RESULTS, "time"), draw)
