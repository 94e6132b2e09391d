"""What the evidence scripts share: the natural users' data, running sweep files, reading runs.

``compression_curves.py`` and ``time_curves.py`` each run two sweep files (an MNIST-1D task and
FedProx's Synthetic(1,1) with 1,000 natural users in LEAF's format) and read every run's
evaluations from its metrics.jsonl.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from fljax.data.leaf import write_synthetic
from fljax.sweep import load_sweep, slug

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
