"""Per-round speed of fljax FedAvg next to the tools FL papers run: a plain PyTorch loop, Flower's
simulation and FedJAX, in the small-model many-client regime.

    python benchmarks/peers.py [--quick] [--fedjax-env build/fedjax-venv] [--out BENCHMARKS.md]

Two workloads on synthetic data, 1000 clients x 50 examples, cohort 100 per round, 1 local epoch
at batch 10 (5 steps of plain SGD, lr 0.05), FedAvg:
  (i)  an MLP 784-200-200-10 on 28x28x1 images, flattened (``make_model('mlp', ...)``);
  (ii) the pfl-research CIFAR-10 CNN on 32x32x3 (round_speed's setup (b) at cohort 100).
Rows: fljax (make_round's defaults, and all clients vmapped), round_speed's PyTorch per-client
loop, Flower's Ray simulation of the same torch model and loop (a helper process), and FedJAX
(``benchmarks/fedjax_round.py`` in the environment ``bash benchmarks/fedjax_env.sh`` builds;
skipped when it is missing). One warm-up round each, then timed rounds taken round-robin over a
workload's rows (``timing.round_robin``); a row's time is their median.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import importlib.metadata
import json
import os
import subprocess
import sys
import time
from typing import NamedTuple, Sequence

import jax
import numpy as np

import fljax
from fljax.models import DEFAULT_CONV_IMPL, make_model, num_params
from round_speed import (NUM_CLASSES, SETUPS, TORCH_THREADS, Candidate, Row, Setup,
                         check_same_size, disturbance, fljax_round, measure, synthetic_data,
                         torch_data, torch_local_sgd, torch_model, torch_round, verdict)
from timing import descendants_cpu_seconds, machine, write_section

HERE = os.path.dirname(os.path.abspath(__file__))
MARKER = "@peer "            # a helper process's answer line (see fedjax_round.py)
TARGET_FLOWER = 20.0         # fljax >= 20x faster than Flower's simulation
TARGET_TORCH = 5.0           # fljax >= 5x faster than the PyTorch per-client loop
RAY_INIT = {"num_cpus": 2, "include_dashboard": False}
HEADING = "Peers (`benchmarks/peers.py`)"

WORKLOADS = (
    Setup(tag="(i)", description="MLP on 28x28x1 (flattened), 100 of 1000 clients x 50 examples, "
                                 "1 epoch at B10",
          model_note="make_model('mlp', (28, 28, 1), 10)", image=(28, 28, 1), channels=(),
          hidden=(200, 200), build=lambda impl: make_model("mlp", (28, 28, 1), NUM_CLASSES),
          num_clients=1000, examples_per_client=50, cohort=100, batch=10, local_steps=None,
          local_epochs=1, slow_conv_row=False),
    SETUPS[1]._replace(tag="(ii)", cohort=100,
                       description="2-conv CNN on 32x32x3 (pfl-research CIFAR-10 CNN), 100 of "
                                   "1000 clients x 50 examples, 1 epoch at B10"),
)


# ---------------------------------------------------------------- helper processes

class Worker:
    """A helper process that runs one round for each line it reads on stdin and answers each with
    a line ``@peer {json}``; its first such line (``info``) describes it."""

    def __init__(self, command: Sequence[str], env: dict[str, str] | None = None):
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True, env=env)
        self.info = self.reply()

    def reply(self) -> dict:
        """The next answer; the process's other output is passed on to stderr."""
        for line in self.process.stdout:
            if line.startswith(MARKER):
                return json.loads(line[len(MARKER):])
            sys.stderr.write(line)
        raise RuntimeError(f"helper process {self.process.args[:3]} exited with status "
                           f"{self.process.wait()}")

    def run_round(self) -> None:
        self.process.stdin.write("round\n")
        self.process.stdin.flush()
        self.reply()

    def close(self) -> None:
        """Close its stdin (it then ends by itself); kill it if it has not within 5 minutes."""
        self.process.stdin.close()
        try:
            self.process.wait(timeout=300)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def answer(message: dict) -> None:
    print(MARKER + json.dumps(message), flush=True)


# ---------------------------------------------------------------- Flower (runs in a helper)

@functools.cache
def workload_tensors(workload: int):
    """The workload's synthetic data as torch tensors, made once per process (a Ray actor)."""
    return torch_data(*synthetic_data(WORKLOADS[workload]))


def flower_client(workload: int, context):
    """Flower's ``client_fn``: the client ``partition-id`` as a NumPyClient whose ``fit`` builds
    the torch model, loads the global parameters, and trains them with the PyTorch row's loop
    (``round_speed.torch_local_sgd``). Flower is imported here: peers.py imports without it."""
    import torch
    from flwr.client import NumPyClient

    setup = WORKLOADS[workload]
    n = setup.examples_per_client
    begin = int(context.node_config["partition-id"]) * n

    class TorchClient(NumPyClient):
        def fit(self, parameters, config):
            model = torch_model(setup)
            model.load_state_dict(dict(zip(model.state_dict(), map(torch.tensor, parameters))))
            xs, ys = workload_tensors(workload)
            torch_local_sgd(setup, model, xs[begin:begin + n], ys[begin:begin + n])
            return [v.numpy() for v in model.state_dict().values()], n, {}

    return TorchClient().to_client()


def flower_worker(workload: int, num_rounds: int) -> None:
    """Flower's simulation of a workload, one round per line read on stdin (``Worker``).

    ``flwr.simulation.start_simulation`` with 1000 virtual clients on Ray (2 CPUs, 1 per client,
    so 2 actors) and FedAvg sampling the cohort (fraction_fit = cohort / N), no evaluation. Its
    ``configure_fit`` waits for the next line (none: the remaining rounds sample nobody and the
    simulation ends); ``aggregate_fit`` answers once the new global parameters are made.
    """
    import logging

    from flwr.common import ndarrays_to_parameters
    from flwr.server import ServerConfig
    from flwr.server.strategy import FedAvg
    from flwr.simulation import start_simulation

    setup = WORKLOADS[workload]
    initial = [v.numpy() for v in torch_model(setup).state_dict().values()]
    answer({"params": int(sum(a.size for a in initial))})
    logging.getLogger("flwr").setLevel(logging.WARNING)

    class SteppedFedAvg(FedAvg):
        def configure_fit(self, server_round, parameters, client_manager):
            if not sys.stdin.readline():
                return []
            return super().configure_fit(server_round, parameters, client_manager)

        def aggregate_fit(self, server_round, results, failures):
            if failures:
                raise RuntimeError(f"{len(failures)} Flower clients failed: {failures[0]!r}")
            aggregated = super().aggregate_fit(server_round, results, failures)
            answer({"clients": len(results)})
            return aggregated

    strategy = SteppedFedAvg(fraction_fit=setup.cohort / setup.num_clients, fraction_evaluate=0.0,
                             min_fit_clients=setup.cohort, min_evaluate_clients=0,
                             min_available_clients=setup.num_clients, accept_failures=False,
                             initial_parameters=ndarrays_to_parameters(initial))
    start_simulation(client_fn=functools.partial(flower_client, workload),
                     num_clients=setup.num_clients, config=ServerConfig(num_rounds=num_rounds),
                     strategy=strategy, client_resources={"num_cpus": 1}, ray_init_args=RAY_INIT)


def flower_command(workload: int, rounds: int) -> tuple[list[str], dict[str, str]]:
    """The command and environment of a Flower helper: enough rounds for the warm-up and every
    timed round ``round_robin`` may take; no telemetry or usage statistics (offline)."""
    script = "import sys, peers; peers.flower_worker(int(sys.argv[1]), int(sys.argv[2]))"
    path = os.pathsep.join(filter(None, [HERE, os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path, FLWR_TELEMETRY_ENABLED="0", RAY_USAGE_STATS_ENABLED="0",
               RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO="0")
    return [sys.executable, "-c", script, str(workload), str(1 + 2 * rounds)], env


# ---------------------------------------------------------------- FedJAX (runs in a helper)

def fedjax_command(setup: Setup, python: str) -> list[str]:
    """``fedjax_round.py`` on a workload, run by FedJAX's environment's ``python``."""
    def join(widths):
        return ",".join(map(str, widths))

    return [python, os.path.join(HERE, "fedjax_round.py"), "--image", join(setup.image),
            "--channels", join(setup.channels), "--hidden", join(setup.hidden),
            "--clients", str(setup.num_clients), "--examples", str(setup.examples_per_client),
            "--cohort", str(setup.cohort), "--batch", str(setup.batch),
            "--epochs", str(setup.local_epochs)]


# ---------------------------------------------------------------- the rows

class Peers(NamedTuple):
    torch: str | None       # None: the row runs; else why it is skipped
    flower: str | None
    fedjax: str | None
    fedjax_python: str


def available(fedjax_env: str) -> Peers:
    """Which peers can run here, and why not."""
    def missing(module: str) -> str | None:
        try:
            __import__(module)
        except ImportError as error:
            return f"import {module} failed: {error}"
        return None

    python = os.path.join(fedjax_env, "bin", "python")
    fedjax = (None if os.path.exists(python) else
              f"no FedJAX environment at {fedjax_env} (build it: bash benchmarks/fedjax_env.sh)")
    return Peers(missing("torch"), missing("flwr") or missing("ray"), fedjax, python)


def versions(peers: Peers, fedjax_info: dict | None) -> str:
    """The versions of the frameworks that ran."""
    names = ["flax"] + (["torch"] if not peers.torch else []) + (
        ["flwr", "ray"] if not peers.flower else [])
    text = ", ".join(f"{n} {importlib.metadata.version(n)}" for n in names)
    if fedjax_info:
        text += "; FedJAX environment: " + ", ".join(f"{n} {v}" for n, v in
                                                     fedjax_info["versions"].items())
    return text


def fljax_params(setup: Setup) -> int:
    """The parameter count of the workload's fljax model."""
    return num_params(setup.build(DEFAULT_CONV_IMPL).init(jax.random.key(0)))


def check_params(setup: Setup, framework: str, count: int) -> None:
    """A peer's model must have exactly as many parameters as fljax's."""
    ours = fljax_params(setup)
    if count != ours:
        raise RuntimeError(f"{setup.tag}: fljax model has {ours} parameters, {framework} {count}")


def candidates(workload: int, peers: Peers, rounds: int,
               workers: list[Worker]) -> list[Candidate]:
    """A workload's rows; the helper processes it starts are appended to ``workers``."""
    setup = WORKLOADS[workload]
    x, y = synthetic_data(setup)
    data = fljax.federate(x, y, np.split(np.arange(len(y)), setup.num_clients), NUM_CLASSES)
    impl = DEFAULT_CONV_IMPL
    default_chunk = 1 if jax.default_backend() == "cpu" else setup.cohort
    conv = f", {impl} conv" if setup.channels else ""
    rows = [Candidate(f"fljax, make_round defaults (client_chunk={default_chunk}{conv})",
                      "fljax-default", fljax_round(setup, data, impl, None), rounds)]
    if default_chunk != setup.cohort:
        rows.append(Candidate(f"fljax, client_chunk={setup.cohort} (vmap all)", "fljax",
                              fljax_round(setup, data, impl, setup.cohort), rounds))
    if not peers.torch:
        check_same_size(setup)
        rows.append(Candidate(f"PyTorch per-client loop ({TORCH_THREADS} threads)", "torch",
                              torch_round(setup, x, y), rounds))
    if not peers.flower:
        workers.append(Worker(*flower_command(workload, rounds)))
        check_params(setup, "Flower", workers[-1].info["params"])
        rows.append(Candidate("Flower simulation (Ray, 2 actors x 1 CPU)", "flower",
                              workers[-1].run_round, rounds))
    if not peers.fedjax:
        workers.append(Worker(fedjax_command(setup, peers.fedjax_python)))
        check_params(setup, "FedJAX", workers[-1].info["params"])
        rows.append(Candidate("FedJAX fed_avg (haiku)", "fedjax", workers[-1].run_round, rounds))
    return rows


# ---------------------------------------------------------------- report

def table(rows: Sequence[Row]) -> str:
    """One markdown table; a workload's first row describes it."""
    lines = ["| workload | implementation | s/round | rounds/s | examples/s | "
             "fljax default's speed-up over this row |", "|---|---|---|---|---|---|"]
    for i, row in enumerate(rows):
        default = next(r for r in rows if r.setup is row.setup and r.kind == "fljax-default")
        workload = row.setup.tag
        if i == 0 or rows[i - 1].setup is not row.setup:
            workload += (f" {row.setup.description}; model `{row.setup.model_note}` "
                         f"({fljax_params(row.setup):,} parameters)")
        lines.append(f"| {workload} | {row.label} | {row.seconds:.3f} | {1 / row.seconds:.2f} | "
                     f"{row.setup.examples_per_round / row.seconds:,.0f} | "
                     f"{row.seconds / default.seconds:.2f}x |")
    return "\n".join(lines)


def targets(rows: Sequence[Row]) -> str:
    """fljax's speed-up over Flower and the PyTorch loop against the targets, for the default
    fljax row and, where it differs, the fastest one; FedJAX's ratio without a target."""
    goals = {"flower": ("Flower", TARGET_FLOWER), "torch": ("the PyTorch loop", TARGET_TORCH),
             "fedjax": ("FedJAX", None)}
    lines = []
    for setup in dict.fromkeys(r.setup for r in rows):
        same = [r for r in rows if r.setup is setup]
        default = next(r for r in same if r.kind == "fljax-default")
        best = min((r for r in same if r.kind.startswith("fljax")), key=lambda r: r.seconds)
        compared = [("default", default)] + ([("fastest", best)] if best != default else [])
        for title, ours in compared:
            for peer in (r for r in same if r.kind in goals):
                name, goal = goals[peer.kind]
                ratio = peer.seconds / ours.seconds
                target = ("no target" if goal is None else
                          f"target >= {goal:g}x: {verdict(ratio >= goal)}")
                lines.append(f"- {setup.tag} {title} fljax row ({ours.label}) vs {name}: "
                             f"{ratio:.2f}x, {target}")
    return "\n".join(lines)


HEADER = """Wall time of one FedAvg round next to the tools FL papers use, in their usual regime
(small models, many clients), measured side by side in one run of `python benchmarks/peers.py`.
Synthetic data (Gaussian images, uniform labels), 1000 clients x 50 examples, cohort 100 per round,
1 local epoch at batch 10 (5 steps of plain SGD, lr 0.05; 5,000 examples per round), FedAvg
weighted by examples:

- **(i)** MLP 784-200-200-10 on 28x28x1 images, flattened (`make_model('mlp', (28, 28, 1), 10)`;
  FedJAX's `emnist.create_dense_model` shape).
- **(ii)** the pfl-research CIFAR-10 CNN on 32x32x3 (conv5x5-32, pool, conv5x5-64, pool, fc512,
  fc10): round_speed's setup (b) at cohort 100.

Every framework's model has the same parameter count (checked). Rows: **fljax** with
`make_round`'s defaults (sequential clients on CPU) and, as an extra row, all 100 clients in one
`vmap` (`client_chunk=100`). **PyTorch**: round_speed's per-client loop (a fresh copy of the global
model per client, `torch.optim.SGD`, state_dicts averaged; `torch.set_num_threads(2)`).
**Flower**: `flwr.simulation.start_simulation` (Ray on this machine, `num_cpus=2`, 1 CPU per
virtual client, so 2 actors train clients in parallel, each torch at 1 thread as Ray sets it) with
1000 virtual clients, each a `NumPyClient` whose `fit` builds the same torch model, loads the global
parameters and runs the same local loop; strategy `FedAvg` with `fraction_fit=0.1`,
`min_fit_clients=100`, no evaluation, failures not accepted. It runs in a helper process whose
strategy waits for a request in `configure_fit`; a Flower round is timed from that request to the
answer sent when `aggregate_fit` has made the new global parameters (so it covers sampling,
sending parameters to the Ray actors, the clients' work, collecting and averaging; Ray's start
and the first round fall in the warm-up). **FedJAX**: `fedjax.algorithms.fed_avg` (client SGD,
server SGD at lr 1, `UniformGetClientSampler`) on a haiku model of the same architecture, in its
own environment (jax 0.4.30, built by `bash benchmarks/fedjax_env.sh`) and helper process
(`benchmarks/fedjax_round.py`), a round timed the same way from request to answer.

Each row has one warm-up round (compilation, Ray's actors); then timed rounds, taken round-robin
over a workload's rows, each waited for; a row's s/round is their median. A timed round during
which processes other than the benchmark and its helpers took more than 0.1 of a core is dropped
and rerun (at most once per planned round). The last column is the row's s/round over the default
fljax row's.

Targets: fljax is >= 20x faster than Flower's simulation and >= 5x faster than the PyTorch loop.
"""


def idle_cores(seconds: float = 5.0) -> float:
    """Cores the helper processes (Flower's Ray, FedJAX) take while they wait for a request, as
    they do during the other rows' rounds."""
    before = descendants_cpu_seconds()
    time.sleep(seconds)
    return (descendants_cpu_seconds() - before) / seconds


def section(rows: Sequence[Row], quick: bool, rounds: int, peers: Peers,
            fedjax_info: dict | None, idle: dict[str, float]) -> str:
    skipped = [f"- {name}: skipped ({why})" for name, why in
               [("PyTorch", peers.torch), ("Flower", peers.flower), ("FedJAX", peers.fedjax)]
               if why]
    run = "`--quick`" if quick else "full"
    return "\n\n".join([
        HEADER,
        f"Machine: {machine()}. Versions: {versions(peers, fedjax_info)}. "
        f"Date: {datetime.date.today().isoformat()}. Run: {run}, median of {rounds} timed rounds "
        "per row after one warm-up round each.",
        table(rows)] + (["Rows not run:\n\n" + "\n".join(skipped)] if skipped else []) + [
        disturbance(rows)] + ([
        "While waiting between their rounds (so during the other rows' rounds, which they slow "
        "a little), the helper processes took " + ", ".join(
            f"{cores:.3f} of a core in {tag}" for tag, cores in idle.items()) + "."]
        if idle else []) + [
        "Targets:\n\n" + targets(rows)])


# ---------------------------------------------------------------- main

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one timed round per row")
    parser.add_argument("--fedjax-env", default="build/fedjax-venv",
                        help="FedJAX's environment (bash benchmarks/fedjax_env.sh builds it)")
    parser.add_argument("--out", default="BENCHMARKS.md", help="markdown report to write")
    args = parser.parse_args()
    rounds = 1 if args.quick else 7
    peers = available(args.fedjax_env)
    rows, idle, fedjax_info = [], {}, None
    for workload, setup in enumerate(WORKLOADS):
        print(setup.tag, setup.description, flush=True)
        workers = []
        try:
            rows += measure(setup, candidates(workload, peers, rounds, workers))
            if workers:
                idle[setup.tag] = idle_cores()
        finally:
            for worker in workers:
                worker.close()
        fedjax_info = fedjax_info or next((w.info for w in workers if "versions" in w.info), None)
    body = section(rows, args.quick, rounds, peers, fedjax_info, idle)
    print("\n" + body)
    write_section(args.out, HEADING, body)
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
