"""What every evidence and paper sweep costs at full scale, estimated before anyone runs it.

    python experiments/full_scale_costs.py [--out-dir experiments/results/full_scale_plan]

For each sweep file with a ``full`` scale: ``fljax sweep FILE --scale full --plan``'s table
(``fljax.runner.estimate``: every compiled program built and compiled for the host with abstract
inputs of the datasets' known shapes, nothing trained, no data read), written to
``OUT_DIR/NAME.md``; then ``OUT_DIR/summary.md``, one line per paper: its sweeps, programs, runs,
the largest run's device memory, the estimated H100 hours, and the programs that do not fit one
80 GB GPU. Programs of one shape are compiled once for all sweeps.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
GPU_BYTES = 80e9
PAPERS = (   # (label, file name prefixes)
    ("FedDyn as initialization (Rethinking Regularization in Federated Learning: An "
     "Initialization Perspective, 2024)", ("feddyn_init_", "evidence_feddyn_init")),
    ("FedBug (Kao & Wang, 2023)", ("fedbug_", "evidence_fedbug")),
    ("FedGA / GradAlign (Dandi, Barba & Jaggi, AAAI 2022)",
     ("fedga_", "evidence_fedga", "evidence_gradalign")),
    ("FedDecay (FedDecay: Adapting to Data Heterogeneity in Federated Learning with Gradient "
     "Decay, 2023)", ("feddecay_", "evidence_feddecay")),
    ("FedInit (Sun, Shen & Tao, NeurIPS 2023)", ("fedinit_", "evidence_fedinit")),
    ("evidence: compression, privacy, time, Byzantine", ("evidence_",)),
)


def paper_of(name: str) -> str:
    for label, prefixes in PAPERS:
        if name.startswith(prefixes):
            return label
    return "other"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out-dir", default=os.path.join(HERE, "results", "full_scale_plan"))
    parser.add_argument("--only", nargs="+", metavar="NAME", help="only these sweep names")
    args = parser.parse_args()
    from fljax.runner import estimate, sweep

    os.makedirs(args.out_dir, exist_ok=True)
    cache: dict = {}
    rows: dict[str, list] = {}
    for path in sorted(glob.glob(os.path.join(HERE, "*.json"))):
        name = os.path.splitext(os.path.basename(path))[0]
        with open(path) as f:
            if "rows" not in json.load(f) or (args.only and name not in args.only):
                continue
        spec = sweep.load_sweep(path)
        if "full" not in spec.get("scales", {}):
            continue
        start = time.time()
        cell_list = sweep.cells(spec, "full", os.path.join("runs", name))
        programs = estimate.plan([c.config for c in cell_list], cache=cache)
        text = (f"# {name}: what full scale costs, estimated before running\n\n"
                f"`fljax sweep experiments/{name}.json --scale full --plan`\n\n"
                + estimate.plan_table(cell_list, programs, GPU_BYTES) + "\n")
        with open(os.path.join(args.out_dir, f"{name}.md"), "w") as f:
            f.write(text)
        runs = sum(len(p.members) for p in programs)
        hours = sum(sum(cell_list[m].config.rounds for m in p.members)
                    * p.estimate.seconds_per_round for p in programs) / 3600
        peak = max(p.estimate.device_bytes for p in programs)
        too_big = sum(p.estimate.device_bytes > GPU_BYTES for p in programs)
        rows.setdefault(paper_of(name), []).append((name, len(programs), runs, peak, hours,
                                                    too_big))
        print(f"{name}: {len(programs)} programs, {runs} runs, peak {peak / 1e9:.1f} GB, "
              f"{hours:,.1f} H100 hours ({time.time() - start:.0f} s)", file=sys.stderr,
              flush=True)
    lines = ["| paper | sweeps | programs | runs | largest run's device memory, GB | estimated "
             "H100 hours | programs over one 80 GB GPU |", "|---|---|---|---|---|---|---|"]
    for label, _ in PAPERS:
        if label not in rows:
            continue
        got = rows[label]
        lines.append(f"| {label} | {len(got)} | {sum(r[1] for r in got)} | "
                     f"{sum(r[2] for r in got):,} | {max(r[3] for r in got) / 1e9:.1f} | "
                     f"{sum(r[4] for r in got):,.0f} | {sum(r[5] for r in got)} |")
    with open(os.path.join(args.out_dir, "summary.md"), "w") as f:
        f.write("# What full scale costs, per paper\n\n" + "\n".join(lines) + "\n\n"
                + estimate.HOW[0].upper() + estimate.HOW[1:] + ".\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
