"""XLA:CPU kernel flags on round_speed's setup (a): speed of the default fljax round and of its
limit, and whether the result stays the same.

    python benchmarks/xla_flags.py [--quick] [--out BENCHMARKS.md]

XLA reads XLA_FLAGS once, when the backend starts, so every setting runs in its own process: it
builds setup (a), runs 2 rounds of the default fljax row from round 0 and saves the global model
(compared with the no-flag process's) and a hash of the round's compiled program, then times the
default fljax row, the limit and (if torch imports) the PyTorch loop side by side
(``timing.round_robin``: one warm-up round each, then timed rounds). The settings' processes are
interleaved (A B C ... A B C ...) so that a drift of the machine hits them alike; a setting's time
is the median over its processes' medians, and its ratio to no flag is corrected for the drift
with the same process's PyTorch round. A flag this jaxlib does not know makes XLA abort; the
setting is then reported as unknown.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import NamedTuple, Sequence

import jax
import numpy as np

import fljax
from fljax.models import DEFAULT_CONV_IMPL
from round_speed import (NUM_CLASSES, SETUPS, fljax_round_fn, initial_state, limit_round,
                         runner, synthetic_data, torch_round)
from timing import DISTURBED, machine, round_robin, write_section

SETTINGS = (
    "",
    "--xla_cpu_use_xnnpack=true",
    "--xla_cpu_use_onednn=true",
    "--xla_cpu_experimental_xnn_graph_fusion_mode=XNN_GRAPH_FUSION_MODE_GREEDY",
    "--xla_cpu_experimental_xnn_graph_fusion_mode=XNN_GRAPH_FUSION_MODE_GREEDY_SLINKY",
    "--xla_cpu_experimental_ynn_fusion_type=dot,eltwise,reduce",
)
ROWS = ("fljax", "limit", "torch")
TOLERANCE = 1e-5          # max |difference| of the parameters called "the same"
UNKNOWN = "Unknown flag in XLA_FLAGS"
HEADING = "XLA:CPU flags (`benchmarks/xla_flags.py`)"


# ---------------------------------------------------------------- one setting (child process)

def child(rounds: int, params_out: str) -> None:
    """Under the XLA_FLAGS this process was started with: save the global model after 2 rounds
    of setup (a)'s default fljax row to ``params_out``, then time the rows; print the timings and
    a hash of the round's compiled program as JSON."""
    setup = SETUPS[0]
    x, y = synthetic_data(setup)
    data = fljax.federate(x, y, np.split(np.arange(len(y)), setup.num_clients), NUM_CLASSES)
    impl = DEFAULT_CONV_IMPL
    round_fn = fljax_round_fn(setup, data, impl, None)
    state = initial_state(round_fn)
    for _ in range(2):
        state, _ = round_fn(state)
    np.savez(params_out, *jax.tree.leaves(jax.device_get(state.params)))
    program = round_fn.lower(initial_state(round_fn)).compile().as_text()
    runs = {"fljax": runner(round_fn, initial_state(round_fn)),
            "limit": limit_round(setup, data, impl)}
    try:
        runs["torch"] = torch_round(setup, x, y)
    except ImportError:
        pass
    timings = round_robin(list(runs.values()), [rounds] * len(runs))
    print(json.dumps({"timings": {name: t._asdict() for name, t in zip(runs, timings)},
                      "program": hashlib.sha256(program.encode()).hexdigest()}))


# ---------------------------------------------------------------- the settings (parent)

class Result(NamedTuple):
    setting: str
    unknown: bool                        # XLA aborted on the flag
    seconds: dict[str, list[float]]      # row -> each process's median s/round
    disturbed: int                       # timed rounds dropped over the setting's processes
    same_program: bool | None            # every process compiled the no-flag run's program
    diff: float | None                   # max |params - the no-flag run's params| after 2 rounds
    scale: float | None                  # max |params| (to read diff against)


def run_setting(setting: str, rounds: int, params_out: str) -> dict | None:
    """One child process under XLA_FLAGS=setting: its answer (timings and program hash), or None
    if XLA does not know the flag; any other failure is raised."""
    env = dict(os.environ, XLA_FLAGS=setting)
    command = [sys.executable, os.path.abspath(__file__), "--child", "--rounds", str(rounds),
               "--params-out", params_out]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        if UNKNOWN in done.stderr:
            return None
        raise RuntimeError(f"XLA_FLAGS={setting!r}: exit {done.returncode}\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def leaves(path: str) -> list[np.ndarray]:
    with np.load(path) as saved:
        return [saved[f"arr_{i}"] for i in range(len(saved.files))]


def measure_all(settings: Sequence[str], repeats: int, rounds: int) -> list[Result]:
    """Every setting ``repeats`` times, interleaved; parameters compared with the first no-flag
    process's (``settings[0]`` must be the empty setting)."""
    seconds = {s: {row: [] for row in ROWS} for s in settings}
    disturbed = dict.fromkeys(settings, 0)
    unknown, diffs, scales, programs = set(), {}, {}, {}
    with tempfile.TemporaryDirectory() as folder:
        reference = None
        for repeat in range(repeats):
            for i, setting in enumerate(s for s in settings if s not in unknown):
                path = os.path.join(folder, f"params_{repeat}_{i}.npz")
                print(f"[{repeat + 1}/{repeats}] XLA_FLAGS={setting!r}", flush=True)
                done = run_setting(setting, rounds, path)
                if done is None:
                    unknown.add(setting)
                    print("  unknown to this jaxlib", flush=True)
                    continue
                params = leaves(path)
                reference = reference or params
                diff = max(float(np.max(np.abs(a - b))) for a, b in zip(params, reference))
                diffs[setting] = max(diffs.get(setting, 0.0), diff)
                scales[setting] = max(float(np.max(np.abs(a))) for a in params)
                programs.setdefault(setting, set()).add(done["program"])
                timings = done["timings"]
                for row, t in timings.items():
                    seconds[setting][row].append(t["seconds"])
                    disturbed[setting] += t["disturbed"]
                print("  " + ", ".join(f"{row} {t['seconds']:.3f} s" for row, t in timings.items())
                      + f", max |diff| {diff:.3g}", flush=True)
    base = programs.get(settings[0], set())
    return [Result(s, s in unknown, seconds[s], disturbed[s],
                   programs[s] == base if s in programs else None, diffs.get(s), scales.get(s))
            for s in settings]


# ---------------------------------------------------------------- report

def median(result: Result, row: str) -> float | None:
    values = result.seconds.get(row)
    return statistics.median(values) if values else None


def relative(result: Result, base: Result, row: str) -> float:
    """The row's time under ``result``'s setting over its time without a flag, each process's
    first divided by the same process's PyTorch round when that ran: a same-time reference that
    no XLA flag touches, so that the machine's drift between processes cancels."""
    def per_process(r: Result) -> float:
        reference = r.seconds["torch"] or [1.0] * len(r.seconds[row])
        return statistics.median(a / b for a, b in zip(r.seconds[row], reference))

    return per_process(result) / per_process(base)


def sameness(result: Result) -> str:
    if result.diff == 0:
        return "identical"
    if result.diff <= TOLERANCE:
        return f"within {TOLERANCE:g}"
    return "**differs**"


def table(results: Sequence[Result]) -> str:
    base = results[0]
    lines = ["| XLA_FLAGS | fljax s/round | limit s/round | PyTorch s/round (same processes) | "
             "fljax time vs no flag | limit time vs no flag | PyTorch / fljax | "
             "compiled round | max abs diff of params after 2 rounds | same result? |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        name = f"`{r.setting}`" if r.setting else "none"
        if r.unknown:
            lines.append(f"| {name} | unknown to jaxlib {jax.__version__} (XLA aborts) "
                         "| - | - | - | - | - | - | - | - |")
            continue
        ours, limit, torch_s = (median(r, row) for row in ROWS)
        torch_cells = (("-", "-") if torch_s is None else
                       (f"{torch_s:.3f}", f"{torch_s / ours:.2f}x"))
        program = "same as no flag" if r.same_program else "**differs**"
        lines.append(
            f"| {name} | {ours:.3f} | {limit:.3f} | {torch_cells[0]} | "
            f"{relative(r, base, 'fljax'):.3f}x | {relative(r, base, 'limit'):.3f}x | "
            f"{torch_cells[1]} | {program} | {r.diff:.3g} (max abs param {r.scale:.3g}) | "
            f"{sameness(r)} |")
    return "\n".join(lines)


def findings(results: Sequence[Result]) -> str:
    """What the settings change: those that compile no flag's program and give its result bit for
    bit (their time differences are the measurement's noise), the others, which one (if any) makes
    the fljax round faster than that noise, and whether the PyTorch gap on (a) closes."""
    known = [r for r in results if not r.unknown]
    base = known[0]
    same = [r for r in known[1:] if r.same_program and r.diff == 0]
    changed = [r for r in known[1:] if r not in same]
    lines = []
    torch_all = [t for r in known for t in r.seconds["torch"]]
    if torch_all:
        lines.append(f"- The PyTorch round, which no XLA flag touches, took "
                     f"{min(torch_all):.3f} to {max(torch_all):.3f} s/round across the processes: "
                     "the machine drifts, "
                     "hence the drift-corrected ratios.")
    noise = max((abs(relative(r, base, "fljax") - 1) for r in same), default=0.0)
    if same:
        ratios = [relative(r, base, "fljax") for r in same]
        lines.append(f"- Same compiled round and bit-identical result as no flag: "
                     f"{', '.join(f'`{r.setting}`' for r in same)}. These flags change nothing in "
                     f"this round on jaxlib {jax.__version__}; their fljax time vs no flag "
                     f"({min(ratios):.3f}x to {max(ratios):.3f}x) is the measurement's noise.")
    for r in changed:
        lines.append(f"- `{r.setting}`: compiled round "
                     f"{'the same as' if r.same_program else 'different from'} no flag's, result "
                     f"{sameness(r)} (max abs diff {r.diff:.3g}); fljax time "
                     f"{relative(r, base, 'fljax'):.3f}x, limit time "
                     f"{relative(r, base, 'limit'):.3f}x no flag's.")
    winners = [r for r in changed if relative(r, base, "fljax") < 1 - noise]
    best = min(winners, key=lambda r: relative(r, base, "fljax")) if winners else base
    if winners:
        lines.append(f"- Fastest beyond the noise (+-{noise:.1%}): `{best.setting}`, "
                     f"{1 / relative(best, base, 'fljax'):.3f}x the no-flag speed, result "
                     f"{sameness(best)}.")
    else:
        lines.append(f"- No setting makes the default fljax round faster than no flag beyond the "
                     f"noise (+-{noise:.1%}).")
    torch_s = median(best, "torch")
    if torch_s is not None:
        ratio = torch_s / median(best, "fljax")
        lines.append(f"- PyTorch gap on (a): PyTorch / fljax = {ratio:.2f}x in the same processes "
                     f"({'no flag' if best is base else f'`{best.setting}`'}); "
                     f"{'fljax is at least as fast' if ratio >= 1 else 'fljax is slower'}"
                     f"{'' if winners else ', and no flag changes that'}.")
    return "\n".join(lines)


def section(results: Sequence[Result], quick: bool, repeats: int, rounds: int) -> str:
    hit = [r for r in results if r.disturbed]
    noise = (f"No timed round was disturbed (other processes took <= {DISTURBED} of a core)."
             if not hit else "Timed rounds dropped because other processes used the CPU: " +
             ", ".join(f"{r.setting or 'none'}: {r.disturbed}" for r in hit) + ".")
    return "\n\n".join([
        f"""XLA:CPU flags on round_speed's setup (a) (`make_model('small_cnn', (28, 28, 1), 10)`,
10 of 10 clients x 1600 examples, 50 local steps at B32): the default fljax round (`make_round`'s
defaults: im2col conv, clients one after another), its limit (the same 500 SGD steps in one
`lax.scan`) and round_speed's PyTorch loop, measured by `python benchmarks/xla_flags.py`. XLA reads
`XLA_FLAGS` when the backend starts, so each setting runs in its own process: it first runs 2
rounds of the fljax row from round 0 and saves the global model (compared with the no-flag
process's: max abs difference over all parameters; "the same" means <= {TOLERANCE:g}) and hashes
the round's compiled program (XLA's optimized HLO; "compiled round" compares it with no flag's),
then times the rows side by side (`timing.round_robin`: one warm-up round each, then timed rounds,
median). The settings' processes are interleaved (all settings, then all again) so that a drift of
the machine hits them alike; a setting's s/round is the median over its processes. The PyTorch
loop does not use XLA: it is a same-time reference, and "time vs no flag" divides each process's
row time by its PyTorch time before comparing with no flag (drift-corrected). fljax's defaults
are unchanged by this benchmark.""",
        f"Machine: {machine()}. Date: {datetime.date.today().isoformat()}. Run: "
        f"{'`--quick`' if quick else 'full'}, {repeats} process(es) per setting, {rounds} timed "
        "rounds per row in each.",
        table(results),
        noise,
        "Findings:\n\n" + findings(results)])


# ---------------------------------------------------------------- main

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one process per setting, 1 round")
    parser.add_argument("--out", default="BENCHMARKS.md", help="markdown report to write")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--params-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.rounds, args.params_out)
        return
    repeats, rounds = (1, 1) if args.quick else (2, 4)
    results = measure_all(SETTINGS, repeats, rounds)
    body = section(results, args.quick, repeats, rounds)
    print("\n" + body)
    write_section(args.out, HEADING, body)
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
