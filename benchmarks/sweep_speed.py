"""A table's runs one at a time vs in batched programs: the same sweep, both ways, side by side.

    python benchmarks/sweep_speed.py [--quick] [--out BENCHMARKS.md]

Workloads (each a sweep file run through ``fljax sweep``):
  grid     a 40-cell grid of the MNIST-1D 1-D CNN: 4 local lrs x 10 seeds, FedAvg, 2 classes per
           client over 10 clients, all 10 per round, 20 local steps at B32, 100 rounds (the
           README's MNIST-1D run), a validation split for the selection;
  fedinit  experiments/evidence_fedinit.json at its CPU scale (16 columns x 5 seeds), with
           ``--set rounds=ROUNDS`` (100 by default: half the file's 200, to keep the benchmark
           under an hour; every run is shorter alike).
Modes: ``one``: ``--max-runs 1``, every cell its own program, as fljax ran sweeps before batched
runs (seeds of one program load it from the sweep's compilation cache); ``batched``: the cells
that differ only in traced values and data share a program, spread over the host's CPU devices
(one per core). Each (workload, mode) runs in its own process, with a fresh output directory and
compilation cache, one after the other: wall time, compile time (tracing, lowering and XLA
compiling or loading, from JAX's own event timers) and the process's peak resident memory. The
ratio is one / batched; both modes must give the same results table (checked). The ratio is
information, with no target here: the batched-runs target (>= 5x run-rounds/s at R >= 64) is the
GPU's, stated and checked by ``benchmarks/gpu.py``'s runs step.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

HEADING = "Batched runs (`benchmarks/sweep_speed.py`)"
COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
                  "/jax/core/compile/jaxpr_to_mlir_module_duration",
                  "/jax/core/compile/backend_compile_duration")
GRID = {
    "title": "40 cells: cnn1d on MNIST-1D, 4 lrs x 10 seeds",
    "base": {"dataset": "mnist1d", "model": "cnn1d", "partition": "classes",
             "classes_per_client": 2, "num_clients": 10, "clients_per_round": 10,
             "local_steps": 20, "local_epochs": None, "batch_size": 32, "rounds": 100,
             "eval_every": 25, "checkpoint_every": 50, "validation_fraction": 0.1,
             "grid": {"lr": [0.05, 0.1, 0.2, 0.4]}},
    "rows": {"2 classes": {}}, "columns": {"FedAvg": {}},
    "seeds": list(range(10)),
}


def measure(workload: str, mode: str, rounds: int, folder: str) -> dict:
    """One (workload, mode) in this process: the sweep through the CLI, timed."""
    import jax
    from jax import monitoring

    from fljax.runner.cli import main

    compile_seconds = [0.0]

    def listener(event: str, seconds: float, **_):
        if event in COMPILE_EVENTS:
            compile_seconds[0] += seconds

    monitoring.register_event_duration_secs_listener(listener)
    if workload == "grid":
        path = os.path.join(folder, "grid.json")
        with open(path, "w") as f:
            json.dump(GRID, f)
        args = ["sweep", path, "--set", f"rounds={rounds}"]
    else:
        path = os.path.join(os.path.dirname(__file__), "..", "experiments",
                            "evidence_fedinit.json")
        args = ["sweep", path, "--scale", "cpu", "--set", f"rounds={rounds}"]
    out = os.path.join(folder, mode)
    jax.config.update("jax_compilation_cache_dir", os.path.join(out, "xla_cache"))
    args += ["--out-dir", out, "--quiet"] + (["--max-runs", "1"] if mode == "one" else [])
    start = time.perf_counter()
    code = main(args)
    wall = time.perf_counter() - start
    from fljax.runner import grouping
    from fljax.runner import sweep
    cells = sweep.cells(sweep.load_sweep(path), "cpu" if workload == "fedinit" else None, out,
                        rounds=rounds)
    programs = len(grouping.group([c.config for c in cells], 1 if mode == "one" else len(cells)))
    table = open(os.path.join(out, "cpu" if workload == "fedinit" else "base",
                              "results.md")).read()
    return {"code": code, "wall": wall, "compile": compile_seconds[0], "programs": programs,
            "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "devices": jax.local_device_count(), "table": table}


def differing(one: dict, batched: dict) -> str:
    """The table lines (setting and column) where the two results tables differ."""
    found = []
    for a, b in zip(one["table"].splitlines(), batched["table"].splitlines()):
        if a != b:
            cells = list(zip(a.split("|")[2:-1], b.split("|")[2:-1]))
            found += [f"{a.split('|')[1].strip()} column {i + 1} ({x.strip()} vs {y.strip()})"
                      for i, (x, y) in enumerate(cells) if x != y]
    return ", ".join(found)


def row(workload: str, mode: str, rounds: int) -> dict:
    """(workload, mode) in a child process started with one CPU device per core."""
    with tempfile.TemporaryDirectory() as folder:
        result = os.path.join(folder, "result.json")
        env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count="
                                          f"{os.cpu_count() or 1}"}
        subprocess.run([sys.executable, __file__, "--row", workload, mode, str(rounds),
                        result, folder], env=env, check=True)
        with open(result) as f:
            return json.load(f)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="10 rounds per run (a check that it works, not a measurement)")
    parser.add_argument("--out", default="BENCHMARKS.md", help="markdown report to update")
    parser.add_argument("--workloads", default="grid,fedinit")
    parser.add_argument("--fedinit-rounds", type=int, default=100)
    parser.add_argument("--row", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.row:
        workload, mode, rounds, result, folder = args.row
        with open(result, "w") as f:
            json.dump(measure(workload, mode, int(rounds), folder), f)
        return 0
    sys.path.insert(0, os.path.dirname(__file__))
    from timing import machine, write_section

    lines = ["| workload | runs | mode | programs | wall, s | compile, s | peak memory, MB | "
             "one / batched |", "|---|---|---|---|---|---|---|---|"]
    notes = []
    for workload in args.workloads.split(","):
        rounds = 10 if args.quick else (100 if workload == "grid" else args.fedinit_rounds)
        results = {}
        for mode in ("one", "batched"):
            print(f"== {workload}, {mode} at a time", flush=True)
            results[mode] = row(workload, mode, rounds)
        one, batched = results["one"], results["batched"]
        same = one["table"] == batched["table"]
        cells = 40 if workload == "grid" else 80
        for mode, result in results.items():
            ratio = f"{one['wall'] / batched['wall']:.2f}x" if mode == "batched" else ""
            lines.append(f"| {workload} ({rounds} rounds) | {cells} | "
                         f"{'one at a time' if mode == 'one' else 'batched'} | "
                         f"{result['programs']} | {result['wall']:.1f} | "
                         f"{result['compile']:.1f} | {result['peak_mb']:.0f} | {ratio} |")
        notes.append(f"{workload}: the two results tables are "
                     f"{'identical' if same else 'different in ' + differing(one, batched)}; "
                     f"batched, {one['wall'] / batched['wall']:.2f}x one at a time "
                     "(information, no target: the batched-runs target is the GPU's, in "
                     "`benchmarks/gpu.py`'s runs step)")
        print("\n".join(lines), flush=True)
    body = "\n\n".join([
        f"Machine: {machine()}. Date: {datetime.date.today().isoformat()}. "
        f"{'Quick run (10 rounds): not a measurement. ' if args.quick else ''}"
        "Each row is one process running `fljax sweep` with a fresh output directory and "
        "compilation cache; `one at a time` is `--max-runs 1` (each cell its own program, seeds "
        "loading their program from the sweep's cache), `batched` the default (cells of one "
        "program train together, spread over one CPU device per core).",
        "\n".join(lines), "\n".join(f"- {note}." for note in notes)])
    if not args.quick:
        write_section(args.out, HEADING, body)
    print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
