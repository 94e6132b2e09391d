"""What every evidence and paper sweep costs at full scale, estimated before anyone runs it.

    python experiments/full_scale_costs.py [--out-dir experiments/results/full_scale_plan]

For each sweep file with a ``full`` scale: ``fljax sweep FILE --scale full --plan``'s table
(``fljax.runner.estimate``: every compiled program built and compiled for the host with abstract
inputs of the datasets' known shapes, nothing trained, no data read), written to
``OUT_DIR/NAME.md``; then ``OUT_DIR/summary.md``, one line per paper from those files: its
sweeps, programs, runs, the largest run's device memory, the estimated H100 hours, and the
programs whose one run does not fit an 80 GB GPU. Programs of one shape are compiled once for all
the sweeps of one call (``--only NAME ...`` plans some sweeps; ``--summary-only`` rebuilds the
summary).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
GPU_BYTES = 80e9
PAPERS = (   # (label, file name prefixes)
    ("FedDyn as initialization (2024)", ("feddyn_init_", "evidence_feddyn_init")),
    ("FedBug (Kao & Wang, 2023)", ("fedbug_", "evidence_fedbug")),
    ("FedGA / GradAlign (Dandi, Barba & Jaggi, AAAI 2022)",
     ("fedga_", "evidence_fedga", "evidence_gradalign")),
    ("FedDecay (2023)", ("feddecay_", "evidence_feddecay")),
    ("FedInit (Sun, Shen & Tao, NeurIPS 2023)", ("fedinit_", "evidence_fedinit")),
    ("evidence: compression, privacy, time, Byzantine", ("evidence_",)),
)


def paper_of(name: str) -> str:
    for label, prefixes in PAPERS:
        if name.startswith(prefixes):
            return label
    return "other"


def plan_sweeps(out_dir: str, only: list[str] | None) -> None:
    """Write ``OUT_DIR/NAME.md``, the plan of each sweep with a full scale (of ``only``)."""
    from fljax.runner import estimate, sweep

    cache: dict = {}
    for path in sorted(glob.glob(os.path.join(HERE, "*.json"))):
        name = os.path.splitext(os.path.basename(path))[0]
        with open(path) as f:
            if "rows" not in json.load(f) or (only and name not in only):
                continue
        spec = sweep.load_sweep(path)
        if "full" not in spec.get("scales", {}):
            continue
        start = time.time()
        cell_list = sweep.all_stages(spec, "full", os.path.join("runs", name))
        programs = estimate.plan([c.config for c in cell_list], cache=cache)
        table = estimate.plan_table(cell_list, programs, GPU_BYTES)
        with open(os.path.join(out_dir, f"{name}.md"), "w") as f:
            f.write(f"# {name}: what full scale costs, estimated before running\n\n"
                    f"`fljax sweep experiments/{name}.json --scale full --plan`\n\n{table}\n")
        print(f"{name}: {table.split('Total: ')[1].split(chr(10))[0]} "
              f"({time.time() - start:.0f} s)", file=sys.stderr, flush=True)


TOTAL = re.compile(r"Total: (\d+) programs, (\d+) runs, ([\d,.]+) estimated H100 hours; the "
                   r"largest run needs ([\d.]+) GB")


def summary(out_dir: str) -> str:
    """One line per paper from the plans in ``out_dir``: sweeps, programs, runs, the largest
    run's device memory, estimated H100 hours, programs over one GPU."""
    rows: dict[str, list] = {}
    for path in sorted(glob.glob(os.path.join(out_dir, "*.md"))):
        name = os.path.splitext(os.path.basename(path))[0]
        if name == "summary":
            continue
        text = open(path).read()
        programs, runs, hours, peak = TOTAL.search(text).groups()
        over = sum(float(cell) > GPU_BYTES / 1e9 for cell in re.findall(
            r"^\| \d+\. [^|]+\| \d+ \| [\d,]+ \| [\d.]+ \| [\d.]+ \| ([\d.]+) \|", text,
            re.MULTILINE))
        rows.setdefault(paper_of(name), []).append(
            (name, int(programs), int(runs), float(peak), float(hours.replace(",", "")), over))
    lines = ["| paper | sweeps | programs | runs | largest run's device memory, GB | estimated "
             "H100 hours | programs whose one run needs more than 80 GB |",
             "|---|---|---|---|---|---|---|"]
    for label, _ in PAPERS:
        if label in rows:
            got = rows[label]
            lines.append(f"| {label} | {len(got)} | {sum(r[1] for r in got)} | "
                         f"{sum(r[2] for r in got):,} | {max(r[3] for r in got):.1f} | "
                         f"{sum(r[4] for r in got):,.0f} | {sum(r[5] for r in got)} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out-dir", default=os.path.join(HERE, "results", "full_scale_plan"))
    parser.add_argument("--only", nargs="+", metavar="NAME", help="only these sweep names")
    parser.add_argument("--summary-only", action="store_true",
                        help="only rebuild summary.md from the plans already in --out-dir")
    args = parser.parse_args()
    from fljax.runner import estimate

    os.makedirs(args.out_dir, exist_ok=True)
    if not args.summary_only:
        plan_sweeps(args.out_dir, args.only)
    table = summary(args.out_dir)
    with open(os.path.join(args.out_dir, "summary.md"), "w") as f:
        f.write("# What full scale costs, per paper\n\n" + table + "\n\n"
                + estimate.HOW[0].upper() + estimate.HOW[1:] + ".\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
