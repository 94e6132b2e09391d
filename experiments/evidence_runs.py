"""What the evidence scripts share: the natural users' data, running sweep files, reading runs,
writing the report.

``compression_curves.py`` and ``time_curves.py`` each run two sweep files (an MNIST-1D task and
FedProx's Synthetic(1,1) with 1,000 natural users in LEAF's format) and read every run's
evaluations from its metrics.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Callable

from fljax.data.leaf import write_synthetic
from fljax.runner.sweep import load_sweep, slug

HERE = os.path.dirname(os.path.abspath(__file__))
USERS, MAX_SIZE = 1000, 100


def run_sweeps(names: tuple[str, ...], runs_dir: str) -> None:
    """Write the LEAF users a sweep's data_dir names if absent, then run each sweep file
    ``names`` at CPU scale into ``runs_dir``/NAME (resumable: finished runs are not trained
    again)."""
    for name in names:
        base = load_sweep(os.path.join(HERE, name))["base"]
        if base.get("dataset") == "leaf/synthetic":
            data_dir = os.path.expanduser(base["data_dir"])
            if not os.path.isdir(os.path.join(data_dir, "data", "all_data")):
                write_synthetic(data_dir, 1.0, 1.0, num_users=USERS, max_size=MAX_SIZE, seed=0)
    for name in names:
        subprocess.run([sys.executable, "-m", "fljax", "sweep", os.path.join(HERE, name),
                        "--scale", "cpu", "--quiet", "--out-dir",
                        os.path.join(runs_dir, name[:-5])], check=True)


def evaluations(runs_dir: str, name: str, row: str, column: str, seed: int) -> list[dict]:
    """The evaluation records of one run of sweep file ``name``."""
    path = os.path.join(runs_dir, name[:-5], "cpu", slug(row), slug(column), f"seed_{seed}",
                        "metrics.jsonl")
    with open(path) as f:
        return [r for r in map(json.loads, f) if r["kind"] == "eval"]


def report(description: str, sweeps: tuple[str, ...], task: Callable, title: str, script: str,
           out_stem: str, draw: Callable) -> None:
    """The scripts' main: run ``sweeps`` (unless --tables-only), then ``task(name, runs dir) ->
    (table lines whose first is '### ROW', {column: curve}, [verdict lines])`` for each, written
    to OUT_STEM.md under a ``title`` and a Verdict section, and one plot panel per sweep by
    ``draw(axis, curves)`` to OUT_STEM.png."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--runs", default="runs", help="the sweeps' --out-dir parent")
    parser.add_argument("--tables-only", action="store_true",
                        help="read the finished runs without running the sweeps")
    args = parser.parse_args()
    if not args.tables_only:
        run_sweeps(sweeps, args.runs)
    os.makedirs(os.path.dirname(out_stem), exist_ok=True)
    lines = [f"# {title}", "", f"Made by `python experiments/{script}` (see its docstring; the "
             "tasks are the two sweep files' notes). Mean ± std over 10 seeds; paired "
             "differences with a paired t-test's p-value.", ""]
    verdicts, panels = [], []
    for name in sweeps:
        table, curves, verdict = task(name, args.runs)
        lines += table + [""]
        verdicts += verdict
        panels.append((table[0][4:], curves))
    lines += ["## Verdict", ""] + [f"- {v}" for v in verdicts]
    with open(out_stem + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(panels), figsize=(12, 4.5))
    for ax, (panel, curves) in zip(axes, panels):
        draw(ax, curves)
        ax.set_title(panel)
    axes[-1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(out_stem + ".png", dpi=110)
