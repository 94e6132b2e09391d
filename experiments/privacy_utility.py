"""The privacy-utility curve of experiments/evidence_privacy.json: test accuracy against the epsilon
spent, fixed and adaptive clipping, with the non-private run for reference.

    python experiments/privacy_utility.py            # writes the data if absent, runs the sweep
                                                     # (resumable), then the table and the plot

The data are FedProx's Synthetic(1,1) and Synthetic-IID users (fljax.data.synthetic) written as
LEAF JSON into the sweep's data_dirs; the sweep is ``fljax sweep experiments/evidence_privacy.json --scale cpu``.
Outputs: runs/evidence_privacy/cpu/results.md (the sweep's table), privacy_utility.md (accuracy and
epsilon by clipping and target, paired adaptive - fixed differences) and privacy_utility.png.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

from fljax.data.leaf import write_synthetic
from fljax.runner.sweep import load_sweep, paired_difference, slug

HERE = os.path.dirname(os.path.abspath(__file__))
SWEEP = os.path.join(HERE, "evidence_privacy.json")
OUT = os.path.join("runs", "evidence_privacy", "cpu")
USERS, MAX_SIZE = 1000, 100


def final(row: str, column: str, seed: int) -> dict:
    path = os.path.join(OUT, slug(row), slug(column), f"seed_{seed}", "metrics.jsonl")
    with open(path) as f:
        return [r for r in map(json.loads, f) if r["kind"] == "eval"][-1]


def main() -> None:
    sweep = load_sweep(SWEEP)
    for values in [sweep["base"], *sweep["rows"].values()]:
        data_dir = os.path.expanduser(values.get("data_dir", sweep["base"]["data_dir"]))
        if not os.path.isdir(os.path.join(data_dir, "data", "all_data")):
            write_synthetic(data_dir, 1.0, 1.0, num_users=USERS, max_size=MAX_SIZE,
                            iid=data_dir.endswith("_iid"), seed=0)
    subprocess.run([sys.executable, "-m", "fljax", "sweep", SWEEP, "--scale", "cpu"], check=True)
    seeds, rows = sweep["seeds"], list(sweep["rows"])
    private = [c for c in sweep["columns"] if c != "non-private"]
    lines = ["| clipping | target epsilon | z (calibrated) | epsilon spent | test accuracy % |",
             "|---|---|---|---|---|"]
    curves = {}
    for row in rows:
        curves[row] = []
        for column in private:
            runs = [final(row, column, s) for s in seeds]
            acc = [100 * r["accuracy"] for r in runs]
            curves[row].append((runs[0]["epsilon"], np.mean(acc), np.std(acc, ddof=1)))
            lines.append(f"| {row} | {sweep['columns'][column]['target_epsilon']:g} | "
                         f"{runs[0]['noise_multiplier']:.3f} | {runs[0]['epsilon']:.3f} | "
                         f"{np.mean(acc):.2f} ± {np.std(acc, ddof=1):.2f} |")
    plain = {row: [100 * final(row, "non-private", s)["accuracy"] for s in seeds] for row in rows}
    for row in rows[::2]:
        lines.append(f"| {row.split(' ')[0]}: none (FedAvg) | inf | 0 | inf | "
                     f"{np.mean(plain[row]):.2f} ± {np.std(plain[row], ddof=1):.2f} |")
    for fixed, adaptive in zip(rows[::2], rows[1::2]):
        lines += ["", f"{adaptive} - {fixed} (paired by seed, points):", ""]
        for column in private:
            diff = paired_difference(
                [100 * final(adaptive, column, s)["accuracy"] for s in seeds],
                [100 * final(fixed, column, s)["accuracy"] for s in seeds])
            lines.append(f"- {column}: {diff}")
    with open("privacy_utility.md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    for (row, points), color in zip(curves.items(), ["C0", "C0", "C1", "C1"]):
        eps, mean, std = map(np.array, zip(*points))
        ax.errorbar(eps, mean, yerr=std, marker="o", capsize=3, label=row, color=color,
                    linestyle="-" if "fixed" in row else ":")
    for row, color in zip(rows[::2], ["C0", "C1"]):
        ax.axhline(np.mean(plain[row]), color=color, linestyle="--", linewidth=0.8,
                   label=f"{row.split(' ')[0]} non-private")
    ax.set_xscale("log", base=2)
    ax.set_xlabel(f"epsilon spent after {sweep['base']['rounds']} rounds")
    ax.set_ylabel("test accuracy %")
    ax.set_title(f"DP-FedAvg, {USERS} users, q = 0.05")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig("privacy_utility.png", dpi=120)


if __name__ == "__main__":
    main()
