"""What robust aggregation costs: each rule of fljax.robustness.aggregators over the plain weighted mean.

    python benchmarks/robust_cost.py [--quick] [--sizes 10,100,1000] [--cell-limit SECONDS]
                                     [--no-round] [--out BENCHMARKS.md]

Each rule (and each pre-aggregator followed by the coordinate median) applied under ``jax.jit``
to a stack x [m, d] of float32 messages (standard normal, every row real: mask all True), for
m = 10, 100 and 1000 messages and d the parameter count of a real fljax model:
``make_model('cnn1d', (40, 1), 10)`` (the MNIST-1D CNN, 5,210 parameters) and
``make_model('mlp', (8, 8, 1), 10)`` (the digits MLP, 55,210). The rules are called as
``fljax.robust`` calls them, with its defaults: f = m // 10 Byzantine clients assumed wherever a
rule takes f, Multi-Krum's q = n - f, the geometric median's 16 Weiszfeld iterations, one step of
centered clipping (tau 1, from a zero center), buckets of 2; the mask (so n) and the weights are
traced arguments. One row per rule; each cell is the rule's time per call over ``weighted_mean``'s
on the same stack, the rows of a cell (one m and d) timed round-robin in one run
(``timing.round_robin``: a timed round during which other processes took more than 0.1 of a core
is dropped and rerun, at most once per planned round), a cell's time the median of its clean
timed rounds (of all its rounds where none was clean). A timed round is k calls in
a row, each waited for, k chosen so that a round lasts about 50 ms (one call for the slow rules):
so a cell's time includes one call's dispatch from Python, which the "jit floor" row shows (a
jitted function that returns one row of x); inside a compiled round there is none. Rules whose
one call takes over 1 s get fewer timed rounds (as many as fit in 10 s, at least one).

A cell is skipped, with the reason printed and shown in the table, when its call would take over
``--cell-limit`` seconds (default 60), estimated from the same rule at the previous m by the
least growth its work has in m: m^2 for Krum, Multi-Krum, Bulyan and NNM (the [m, m] distances,
O(m^2 d); Bulyan's m Krum selections add O(m^3)), m for the others. The estimate leaves out
log factors, Bulyan's m^3 term and the cache: a cell that runs can take longer than it says.

Unless ``--no-round``, one more table: the wall time of a whole round of
``fljax.robust(fljax.fedavg(fljax.local_sgd(0.05)), rule, f=m // 10)`` over plain
``fljax.fedavg`` on the embedded digits data (``load_digits``, iid over m clients, all m per
round, 5 local steps at batch 16, the digits MLP), m = 10 and 100, rows timed round-robin.
"""

from __future__ import annotations

import argparse
import datetime
import time
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

import fljax
from fljax.robustness import aggregators as agg
from fljax.algorithms.robust import GEOMETRIC_ITERATIONS
from timing import DISTURBED, Timing, machine, round_robin, write_section

MODELS = {"cnn1d": ((40, 1), "MNIST-1D CNN"), "mlp": ((8, 8, 1), "digits MLP")}
SIZES = (10, 100, 1000)
ROUND_TARGET = 0.05    # seconds of calls per timed round
MAX_CALLS = 2000       # calls per timed round at most
REPEATS = 7            # timed rounds per row (--quick: 1)
HEAVY = 1.0            # a rule whose call takes over this many seconds ...
HEAVY_BUDGET = 10.0    # ... gets as many timed rounds as fit in this many seconds (at least 1)
CELL_LIMIT = 60.0      # default --cell-limit: a cell estimated over this many s per call is skipped
QUADRATIC = ("krum", "multi_krum", "bulyan", "nnm + median")   # O(m^2 d) work (and more)
REFERENCE = "weighted_mean"
FLOOR = "jit floor (returns x[0])"


def rules(f: int) -> dict[str, Callable]:
    """name -> a function (x, mask, weights, key, center) -> aggregate [d], as fljax.robust
    calls each rule (with its defaults)."""
    median = agg.coordinate_median
    return {
        FLOOR: lambda x, mask, w, key, center: x[0],
        REFERENCE: lambda x, mask, w, key, center: agg.weighted_mean(x, mask, w),
        "coordinate_median": lambda x, mask, w, key, center: median(x, mask),
        "trimmed_mean": lambda x, mask, w, key, center: agg.trimmed_mean(x, mask, f),
        "krum": lambda x, mask, w, key, center: agg.krum(x, mask, f),
        "multi_krum": lambda x, mask, w, key, center: agg.multi_krum(x, mask, f,
                                                                     mask.sum() - f),
        "bulyan": lambda x, mask, w, key, center: agg.bulyan(x, mask, f),
        "geometric_median": lambda x, mask, w, key, center: agg.geometric_median(
            x, mask, w, iterations=GEOMETRIC_ITERATIONS),
        "centered_clipping": lambda x, mask, w, key, center: agg.centered_clipping(
            x, mask, center, tau=1.0, iterations=1),
        "nnm + median": lambda x, mask, w, key, center: median(
            *agg.nearest_neighbor_mixing(x, mask, f)),
        "bucketing(2) + median": lambda x, mask, w, key, center: median(
            *agg.bucketing(x, mask, key, 2)),
        "arc + median": lambda x, mask, w, key, center: median(
            *agg.adaptive_robust_clipping(x, mask, f)),
    }


class Row(NamedTuple):
    run: Callable[[], None]   # one timed round (its first call is a no-op: warmed up already)
    calls: int                # calls per timed round
    rounds: int               # timed rounds wanted
    first_call: float         # seconds of one call after compiling (calibration)


def prepared(fn: Callable, args: tuple, repeats: int) -> Row:
    """Compile ``fn``, time one call, and return its timed round: k calls, each waited for."""
    jitted = jax.jit(fn)
    jax.block_until_ready(jitted(*args))          # compile
    start = time.perf_counter()
    jax.block_until_ready(jitted(*args))
    one = time.perf_counter() - start
    calls = max(1, min(MAX_CALLS, round(ROUND_TARGET / max(one, 1e-7))))
    rounds = repeats if one <= HEAVY else max(1, min(repeats, int(HEAVY_BUDGET / one)))
    warmed = False

    def run():
        nonlocal warmed
        if not warmed:      # round_robin's warm-up call: compiled and run above already
            warmed = True
            return
        for _ in range(calls):
            jax.block_until_ready(jitted(*args))

    return Row(run, calls, rounds, one)


def estimate(name: str, m: int, previous: dict[int, float]) -> tuple[float, str] | None:
    """A lower bound of one call's seconds at m from the same rule at the largest smaller m."""
    smaller = [p for p in previous if p < m]
    if not smaller:
        return None
    p = max(smaller)
    power = 2 if name in QUADRATIC else 1
    return previous[p] * (m / p) ** power, f"{previous[p]:.3g} s at m = {p} x (m/{p})^{power}"


def cell(d: int, m: int, repeats: int, cell_limit: float, history: dict[str, dict[int, float]],
         ) -> tuple[dict[str, float | str], list[Timing]]:
    """Time every rule on one [m, d] stack: {name: seconds per call, or the reason it was
    skipped}, and the rows' timings."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((m, d), dtype=np.float32))
    mask = jnp.ones(m, bool)
    args = (x, mask, jnp.full(m, 1.0 / m, jnp.float32), jax.random.key(0),
            jnp.zeros(d, jnp.float32))
    names, runs, skipped = [], [], {}
    for name, fn in rules(m // 10).items():
        guess = estimate(name, m, history.setdefault(name, {}))
        if guess is not None and guess[0] > cell_limit:
            skipped[name] = (f"skipped: one call estimated >= {guess[0]:.0f} s "
                             f"({guess[1]}), over --cell-limit {cell_limit:g} s")
            print(f"  d={d} m={m} {name}: {skipped[name]}", flush=True)
            continue
        start = time.perf_counter()
        row = prepared(fn, args, repeats)
        print(f"  d={d} m={m} {name}: compiled and calibrated in "
              f"{time.perf_counter() - start:.1f} s, one call {row.first_call * 1e3:.3g} ms, "
              f"{row.calls} calls x {row.rounds} timed rounds", flush=True)
        names.append(name)
        runs.append(row)
    timings: list[Timing] = round_robin([r.run for r in runs], [r.rounds for r in runs])
    result: dict[str, float | str] = dict(skipped)
    for name, row, t in zip(names, runs, timings):
        result[name] = t.seconds / row.calls
        history[name][m] = result[name]
    print(f"  d={d} m={m}: {disturbance(timings)}", flush=True)
    return result, timings


def ratio_table(models: dict[str, int], sizes, cells, timings) -> list[str]:
    columns = [(name, d, m) for name, d in models.items() for m in sizes]
    lines = ["| rule | " + " | ".join(f"{name} m={m}" for name, _, m in columns) + " |",
             "|---|" + "---|" * len(columns)]
    base = {key: cells[key][REFERENCE] for key in cells}
    lines.append(f"| **{REFERENCE}, ms per call** | " + " | ".join(
        f"**{base[name, m] * 1e3:.3g}**" for name, _, m in columns) + " |")
    notes = []
    for rule in rules(1):
        if rule == REFERENCE:
            continue
        values = []
        for name, _, m in columns:
            value = cells[name, m][rule]
            if isinstance(value, str):
                notes.append(f"- {rule}, {name} m={m}: {value}")
                values.append("skipped")
            else:
                values.append(f"{value / base[name, m]:.3g}x")
        lines.append(f"| {rule} | " + " | ".join(values) + " |")
    lines += ["", "Skipped cells:" if notes else "No cell was skipped.", *notes, "",
              disturbance([t for row in timings.values() for t in row])]
    return lines


def disturbance(timings: list[Timing]) -> str:
    """One sentence on the timed rounds during which other processes used the CPU."""
    bad = sum(t.disturbed for t in timings)
    if not bad:
        return (f"No timed round was disturbed (other processes took <= {DISTURBED} of a core "
                "during every timed round).")
    unclean = sum(1 for t in timings if not t.clean)
    return (f"{bad} of {bad + sum(t.clean for t in timings)} timed rounds were disturbed (other "
            f"processes took > {DISTURBED} of a core meanwhile) and dropped; "
            + (f"{unclean} of {len(timings)} rows had no clean round, their median is over "
               "their disturbed rounds." if unclean else "every row's median is over clean "
               "rounds."))


def round_table(sizes, repeats: int) -> list[str]:
    """Whole rounds of fljax.robust(fedavg, rule) over plain FedAvg on digits."""
    from fljax.data import federate, iid, load_digits
    from round_speed import runner

    ds = load_digits()
    model = fljax.make_model("mlp", ds.x_train.shape[1:], ds.num_classes)
    params = model.init(jax.random.key(0))
    names = ["fedavg"] + ["median", "trimmed_mean", "krum", "multi_krum", "bulyan",
                          "geometric_median", "centered_clipping"]
    lines = ["| m (clients per round) | fedavg s/round | " + " | ".join(names[1:]) + " |",
             "|---|---|" + "---|" * (len(names) - 1)]
    every = []
    for m in sizes:
        data = federate(ds.x_train, ds.y_train, iid(ds.y_train, m, seed=0), ds.num_classes)
        runs = []
        for name in names:
            algorithm = fljax.fedavg(fljax.local_sgd(0.05))
            if name != "fedavg":
                algorithm = fljax.robust(algorithm, name, f=m // 10)
            round_fn = fljax.make_round(algorithm, model, data, clients_per_round=m,
                                        batch_size=16, local_steps=5)
            runs.append(runner(round_fn, round_fn.init_state(params, seed=0)))
        print(f"  round, m={m}: {len(runs)} rows built", flush=True)
        timings = round_robin(runs, [repeats] * len(runs))
        every += timings
        base = timings[0].seconds
        lines.append(f"| {m} | {base:.4f} | " + " | ".join(
            f"{t.seconds / base:.2f}x" for t in timings[1:]) + " |")
    return lines + ["", disturbance(every)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="one timed round per row, m = 10 and 100 unless --sizes; writes "
                             "only with --out")
    parser.add_argument("--sizes", default=None,
                        help="comma-separated m (default 10,100,1000; --quick: 10,100)")
    parser.add_argument("--cell-limit", type=float, default=CELL_LIMIT,
                        help="skip a cell whose one call is estimated over this many seconds")
    parser.add_argument("--no-round", action="store_true", help="no whole-round table")
    parser.add_argument("--out", default=None,
                        help="markdown report to write (default BENCHMARKS.md; --quick: none)")
    args = parser.parse_args()
    sizes = tuple(int(s) for s in args.sizes.split(",")) if args.sizes else \
        (SIZES[:2] if args.quick else SIZES)
    out = args.out if args.out or args.quick else "BENCHMARKS.md"
    repeats = 1 if args.quick else REPEATS
    started = time.perf_counter()
    models = {}
    for name, (shape, _) in MODELS.items():
        model = fljax.make_model(name, shape, 10)
        models[name] = sum(leaf.size for leaf in jax.tree.leaves(model.init(jax.random.key(0))))
    cells, timings = {}, {}
    for name, d in models.items():
        history: dict[str, dict[int, float]] = {}
        for m in sizes:
            print(f"{name} (d = {d:,}), m = {m}", flush=True)
            cells[name, m], timings[name, m] = cell(d, m, repeats, args.cell_limit, history)
    run = "quick, one timed round per row" if args.quick else \
        f"full, median of {REPEATS} timed rounds per row (fewer for calls over {HEAVY:g} s)"
    lines = [f"Machine: {machine()}. Date: {datetime.date.today().isoformat()}. Run: {run}, "
             f"--cell-limit {args.cell_limit:g}.", "",
             "Time per call over weighted_mean's on the same [m, d] stack (d: "
             + ", ".join(f"{name} {d:,}" for name, d in models.items()) + "); the first row is "
             "weighted_mean's own time per call, in ms.", "",
             *ratio_table(models, sizes, cells, timings)]
    if not args.no_round:
        round_sizes = tuple(m for m in sizes if m <= 100)
        print("whole rounds on digits", flush=True)
        lines += ["", "Whole rounds on digits (MLP, iid, all m clients per round, 5 local steps "
                  "at batch 16): plain FedAvg's s/round, then fljax.robust(fedavg, rule, "
                  "f = m // 10) over it.", "", *round_table(round_sizes, repeats)]
    seconds = time.perf_counter() - started
    lines += ["", f"The script ran for {seconds / 60:.1f} minutes."]
    body = "\n".join(lines)
    print("\n" + body)
    if out:
        backend = "GPU" if jax.default_backend() == "gpu" else "CPU"
        write_section(out, f"Robust aggregation cost, {backend} (`benchmarks/robust_cost.py`)",
                      __doc__.split("\n\n", 2)[2].strip() + "\n\n" + body)
        print(f"\nwritten to {out}")


if __name__ == "__main__":
    main()
