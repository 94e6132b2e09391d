"""Accuracy against uplink bits for every compressor: experiments/evidence_compression.json
(MNIST-1D, non-IID) and experiments/evidence_compression_natural.json (1,000 natural users).

    python experiments/compression_curves.py [--runs runs]   # writes the natural users' data if
                                                            # absent, runs both sweeps (resumable),
                                                            # then the table and the plot

Outputs, in experiments/results/compression/: compression.md (per task and compressor: uplink bits
per client per round, final test accuracy, the paired difference to FedAvg, and the cumulative
uplink bits at which the test accuracy first reaches FedAvg's, within 1 point) and compression.png
(mean test accuracy over seeds against cumulative uplink bits, log scale).

"Reaches FedAvg's accuracy", paired by seed: on seed s the target is FedAvg's own final test
accuracy on seed s minus 1 point; a run reaches it at its first evaluation at or above it. (A
first version took one target for all seeds, FedAvg's mean minus 1 point; FedAvg itself missed it
on 3 of 10 MNIST-1D seeds, so the comparison is now paired, as every claim here is.) A
compressor's cost is the mean over seeds of the cumulative uplink bits there, over the seeds that
reach it (n of 10 shown). The verdict names the compressor that reaches the target in every seed
with the fewest bits, else the one that does in the most seeds.
"""


from __future__ import annotations

import os

import numpy as np

from evidence_runs import HERE, evaluations, report
from fljax.runner.sweep import load_sweep, paired_difference

SWEEPS = ("evidence_compression.json", "evidence_compression_natural.json")
RESULTS = os.path.join(HERE, "results", "compression")
TOLERANCE = 1.0   # points below FedAvg's mean final accuracy that count as reaching it


def bits_to_reach(evals: list[dict], target: float) -> float | None:
    """Cumulative uplink bits at the first evaluation with test accuracy >= target (%)."""
    for e in evals:
        if 100 * e["accuracy"] >= target:
            return e["uplink_bits"]
    return None


def task(name: str, runs_dir: str) -> tuple[list[str], dict, str]:
    """(table lines, {column: (bits [evals], mean accuracy % [evals])}, verdict) of one sweep."""
    sweep = load_sweep(os.path.join(HERE, name))
    (row,), seeds, columns = list(sweep["rows"]), sweep["seeds"], list(sweep["columns"])
    runs = {c: [evaluations(runs_dir, name, row, c, s) for s in seeds] for c in columns}
    final = {c: [100 * r[-1]["accuracy"] for r in runs[c]] for c in columns}
    targets = [a - TOLERANCE for a in final["FedAvg"]]          # paired: each seed's own
    rounds = runs["FedAvg"][0][-1]["round"]
    per_client = {c: runs[c][0][-1]["uplink_bits"] / (rounds * sweep["base"]["clients_per_round"])
                  for c in columns}
    lines = [f"### {row}", "", f"Target on each seed: FedAvg's final test accuracy on that seed "
             f"minus {TOLERANCE:g} point (FedAvg's mean final accuracy "
             f"{np.mean(final['FedAvg']):.2f} %).", "",
             "| compressor | uplink kbit per client per round | / FedAvg | final test accuracy % | "
             "- FedAvg (paired, points) | uplink Mbit to reach the target | / FedAvg | seeds "
             "reaching it |", "|---|---|---|---|---|---|---|---|"]
    reached, curves = {}, {}
    for c in columns:
        hits = [b for b in (bits_to_reach(r, t) for r, t in zip(runs[c], targets))
                if b is not None]
        reached[c] = (np.mean(hits) if hits else np.inf, len(hits))
        diff = "-" if c == "FedAvg" else paired_difference(final[c], final["FedAvg"])
        cost = f"{reached[c][0] / 1e6:.3g}" if hits else "never"
        relative = f"{reached[c][0] / reached['FedAvg'][0]:.3f}x" if hits else "-"
        lines.append(f"| {c} | {per_client[c] / 1e3:.4g} | "
                     f"{per_client[c] / per_client['FedAvg']:.4f}x | {np.mean(final[c]):.2f} ± "
                     f"{np.std(final[c], ddof=1):.2f} | {diff} | {cost} | {relative} | "
                     f"{len(hits)}/{len(seeds)} |")
        bits = np.array([e["uplink_bits"] for e in runs[c][0]])
        acc = np.mean([[100 * e["accuracy"] for e in r] for r in runs[c]], axis=0)
        curves[c] = (bits, acc)
    most = max(n for c, (_, n) in reached.items() if c != "FedAvg")
    candidates = {c: bits for c, (bits, n) in reached.items() if n == most and c != "FedAvg"}
    if most == 0:
        verdict = f"{row}: no compressor reaches FedAvg's accuracy on any seed."
    else:
        best = min(candidates, key=candidates.get)
        where = "every seed" if most == len(seeds) else f"{most} of {len(seeds)} seeds (the most)"
        verdict = (f"{row}: **{best}** reaches FedAvg's accuracy (its seed's, within "
                   f"{TOLERANCE:g} point) in {where} with the fewest uplink bits, "
                   f"{candidates[best] / 1e6:.3g} Mbit, "
                   f"{candidates[best] / reached['FedAvg'][0]:.3f}x FedAvg's "
                   f"{reached['FedAvg'][0] / 1e6:.3g} Mbit.")
    return lines, curves, [verdict]


def draw(ax, curves) -> None:
    """Mean test accuracy against cumulative uplink bits, log scale, one line per column."""
    for i, (column, (bits, acc)) in enumerate(curves.items()):
        ax.plot(bits, acc, marker=".", label=column, color=f"C{i % 10}",
                linestyle="-" if i < 10 else "--", linewidth=2 if column == "FedAvg" else 1)
    ax.set_xscale("log")
    ax.set_xlabel("cumulative uplink bits (all clients)")
    ax.set_ylabel("test accuracy % (mean of 10 seeds)")


if __name__ == "__main__":
    report(__doc__.splitlines()[0], SWEEPS, task, "Compression: accuracy against uplink bits",
           "compression_curves.py", os.path.join(RESULTS, "compression"), draw)
