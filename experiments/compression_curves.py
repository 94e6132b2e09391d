"""Accuracy against uplink bits for every compressor: experiments/evidence_compression.json
(MNIST-1D, non-IID) and experiments/evidence_compression_natural.json (1,000 natural users).

    python experiments/compression_curves.py [--runs runs]   # writes the natural users' data if
                                                            # absent, runs both sweeps (resumable),
                                                            # then the table and the plot

Outputs, in experiments/results/compression/: compression.md (per task and compressor: uplink bits
per client per round, final test accuracy, the paired difference to FedAvg, and the cumulative
uplink bits at which the test accuracy first reaches FedAvg's, within 1 point) and compression.png
(mean test accuracy over seeds against cumulative uplink bits, log scale).

"Reaches FedAvg's accuracy": the target of a task is FedAvg's mean final test accuracy minus 1
point (the seeds' spread is about that); a run reaches it at its first evaluation at or above it.
A compressor's cost is the mean over seeds of the cumulative uplink bits there, over the seeds
that reach it (n of 10 shown). The verdict names the compressor that reaches the target in every
seed with the fewest bits.
"""

from __future__ import annotations

import argparse
import os

import numpy as np

from evidence_runs import HERE, evaluations, run_sweeps
from fljax.sweep import load_sweep, paired_difference

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
    target = float(np.mean(final["FedAvg"])) - TOLERANCE
    rounds = runs["FedAvg"][0][-1]["round"]
    per_client = {c: runs[c][0][-1]["uplink_bits"] / (rounds * sweep["base"]["clients_per_round"])
                  for c in columns}
    lines = [f"### {row}", "", f"Target: FedAvg's mean final test accuracy "
             f"{np.mean(final['FedAvg']):.2f} % minus {TOLERANCE:g} point = {target:.2f} %.", "",
             "| compressor | uplink kbit per client per round | / FedAvg | final test accuracy % | "
             "- FedAvg (paired, points) | uplink Mbit to reach the target | / FedAvg | seeds "
             "reaching it |", "|---|---|---|---|---|---|---|---|"]
    reached, curves = {}, {}
    for c in columns:
        hits = [b for b in (bits_to_reach(r, target) for r in runs[c]) if b is not None]
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
    every = {c: bits for c, (bits, n) in reached.items() if n == len(seeds) and c != "FedAvg"}
    if every:
        best = min(every, key=every.get)
        verdict = (f"{row}: **{best}** reaches FedAvg's accuracy (within {TOLERANCE:g} point) in "
                   f"every seed with the fewest uplink bits, {every[best] / 1e6:.3g} Mbit, "
                   f"{every[best] / reached['FedAvg'][0]:.3f}x FedAvg's "
                   f"{reached['FedAvg'][0] / 1e6:.3g} Mbit.")
    else:
        verdict = f"{row}: no compressor reaches FedAvg's accuracy in every seed."
    return lines, curves, verdict


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="runs", help="the sweeps' --out-dir parent")
    args = parser.parse_args()
    run_sweeps(SWEEPS, args.runs)
    os.makedirs(RESULTS, exist_ok=True)
    lines = ["# Compression: accuracy against uplink bits", "",
             "Made by `python experiments/compression_curves.py` (see its docstring; the tasks "
             "are the two sweep files' notes). Mean ± std over 10 seeds; paired differences "
             "with a paired t-test's p-value.", ""]
    verdicts, panels = [], []
    for name in SWEEPS:
        table, curves, verdict = task(name, args.runs)
        lines += table + [""]
        verdicts.append(verdict)
        panels.append((table[0][4:], curves))
    lines += ["## Verdict", ""] + [f"- {v}" for v in verdicts]
    with open(os.path.join(RESULTS, "compression.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(panels), figsize=(12, 4.5))
    for ax, (title, curves) in zip(axes, panels):
        for i, (column, (bits, acc)) in enumerate(curves.items()):
            ax.plot(bits, acc, marker=".", label=column, color=f"C{i % 10}",
                    linestyle="-" if i < 10 else "--", linewidth=2 if column == "FedAvg" else 1)
        ax.set_xscale("log")
        ax.set_xlabel("cumulative uplink bits (all clients)")
        ax.set_ylabel("test accuracy % (mean of 10 seeds)")
        ax.set_title(title)
    axes[-1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(os.path.join(RESULTS, "compression.png"), dpi=110)


if __name__ == "__main__":
    main()
