"""What a sweep costs before it runs: each compiled program's size, memory, FLOPs and time.

``abstract_round(config)`` builds the config's real round (``make_round``: its algorithm, model,
split and local work) on inputs that are only shapes: the dataset's known shapes
(``fljax.data.shapes``), or the data itself when it loads (an offline dataset, or a ``data_dir``
that holds it). ``estimate(config)`` compiles that round for the host, set as a GPU runs it (the
sampled clients side by side), and reads from XLA:

- device bytes: ``compiled.memory_analysis()`` (arguments + outputs - donated + temporaries);
- FLOPs per round: ``fljax.accounting.hlo_flops`` of the compiled program (matmuls and
  convolutions, every loop body times its trip count);
- estimated H100 seconds per round: FLOPs / ``H100_FLOPS``, the rate one measured H100 round
  reached (``BENCHMARKS.md``, "What full scale costs"); a model that uses the GPU better or worse
  than that round's CNN runs faster or slower than estimated (``benchmarks/gpu.py --only
  calibrate`` measures the error).

``plan(cells)`` groups a sweep's cells into programs as the batching does
(``fljax.runner.grouping``) and estimates each once per distinct shape. Nothing is trained and no
data is read, except the config's own when present.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple, Sequence

import jax
import numpy as np

from fljax.accounting import hlo_flops
from fljax.data import loaders, shapes
from fljax.data.dataset import Dataset
from fljax.data.federated import FederatedData, with_parts
from fljax.errors import FljaxError
from fljax.population.stragglers import sampled
from fljax.models import Model
from fljax.core.engine import RoundFunction, make_round
from fljax.runner import grouping
from fljax.runner.config import ExperimentConfig
from fljax.runner.experiment import (build_algorithm, build_probes, client_parts,
                                     experiment_model, round_settings, with_class_noise)

# FLOPs per second of one H100 round: round_speed's setup (b) (50 clients x 50 examples, 1 epoch
# at batch 10, the 2-conv CNN, im2col convolutions, clients side by side) counts 108.07 GFLOP
# (hlo_flops of its compiled round) and ran in 0.0092 s (BENCHMARKS.md, GPU rows, step 2).
H100_SETUP_B_FLOPS = 108.07e9
H100_SETUP_B_SECONDS = 0.0092
H100_FLOPS = H100_SETUP_B_FLOPS / H100_SETUP_B_SECONDS
HOW = ("an estimate: each program compiled for the host with abstract inputs of the real shapes "
       "(the clients side by side, as on a GPU); memory is XLA's memory_analysis of that "
       "program, time its FLOPs at the rate of one measured H100 round "
       f"({H100_FLOPS / 1e12:.1f} TFLOP/s; BENCHMARKS.md, 'What full scale costs')")


class AbstractRound(NamedTuple):
    round_fn: RoundFunction     # the config's round, its data abstract
    state: Any                  # the round's state as jax.ShapeDtypeStruct
    data: FederatedData         # x, y abstract; index, offset, count concrete
    model: Model
    algorithm: Any
    source: str                 # where the shapes come from


class Estimate(NamedTuple):
    params: int                 # the global model's parameters
    client_state_bytes: int     # every client's persistent state (SCAFFOLD's c_i, FedDyn's h_i..)
    state_bytes: int            # the whole round state (model, server and client states)
    data_bytes: int             # the clients' examples on the device
    device_bytes: int           # XLA's peak for one run: arguments + outputs - donated + temps
    flops_per_round: float      # the compiled round's, times the share of client chunks that
                                # train (``active_fraction``)
    seconds_per_round: float    # estimated on an H100 (H100_FLOPS)
    source: str
    how: str = HOW

    def program_bytes(self, runs: int) -> int:
        """A program of ``runs`` runs side by side: the examples once, the rest once per run."""
        return self.data_bytes + runs * (self.device_bytes - self.data_bytes)


def nbytes(tree) -> int:
    return int(sum(np.prod(a.shape, dtype=np.int64) * np.dtype(a.dtype).itemsize
                   for a in jax.tree.leaves(tree)))


def shapes_of(config: ExperimentConfig, shared: dict | None = None) -> tuple[Dataset, str]:
    """(dataset, where its shapes come from): the config's dataset, or a stand-in of its known
    shapes when it does not load here; kept in ``shared`` by what it depends on."""
    key = ("dataset", config.dataset, config.data_dir, config.num_clients, config.seed,
           config.sample_users, config.class_noise, config.class_noise_reading,
           config.user_test_fraction > 0)
    if shared is not None and key in shared:
        return shared[key]
    found = _shapes_of(config)
    if shared is not None:
        shared[key] = found
    return found


def _shapes_of(config: ExperimentConfig) -> tuple[Dataset, str]:
    offline = (config.dataset in loaders.OFFLINE_DATASETS or config.dataset.startswith(
        ("mnist1d", "synthetic")))
    has_data = config.data_dir is not None and os.path.isdir(os.path.expanduser(
        str(config.data_dir)))
    if offline or has_data or not shapes.known(config.dataset):
        try:
            return with_class_noise(loaders.load_dataset(
                config.dataset, data_dir=config.data_dir, num_clients=config.num_clients,
                seed=config.seed, sample_users=config.sample_users), config), "the data"
        except FljaxError:
            if not shapes.known(config.dataset):
                raise
    note = (shapes.SHAPES.get(config.dataset) or shapes.GRAPHS[config.dataset])
    note = note.note if isinstance(note, shapes.DatasetShape) else note[-1]
    return shapes.stand_in(config.dataset, config.num_clients, config.seed, config.sample_users,
                           config.user_test_fraction > 0), f"known shapes ({note})"


def gpu_client_chunk(config: ExperimentConfig, num_clients: int) -> int:
    """``make_round``'s default ``client_chunk`` off CPU: the largest divisor of the client slots
    (every client under Bernoulli participation, else the sampled cohort) up to the cohort."""
    cohort = sampled(config.options.deadline, config.clients_per_round)
    slots = num_clients if config.participation == "bernoulli" else cohort
    return max(c for c in range(1, cohort + 1) if slots % c == 0)


def active_fraction(config: ExperimentConfig, num_clients: int) -> float:
    """The share of a round's client chunks that train: 1, or under Bernoulli participation
    (each client joins with q = clients_per_round / N; a chunk of c slots with none joined is
    skipped, ``fljax.core.clients.map_sum``) 1 - (1 - q)^c."""
    if config.participation != "bernoulli":
        return 1.0
    q = config.clients_per_round / num_clients
    return 1.0 - (1.0 - q) ** (config.client_chunk or gpu_client_chunk(config, num_clients))


def abstract_round(config: ExperimentConfig, runs: int | None = None,
                   shared: dict | None = None, trace_state: bool = True,
                   client_chunk: int | None = None) -> AbstractRound:
    """The config's round on abstract inputs (module docstring), its clients side by side as a
    GPU runs them (``gpu_client_chunk``) unless the config or ``client_chunk`` sets the chunk.
    ``runs``: a batched round of that many copies of the run. ``shared``: stand-ins and models
    kept between calls, by what they depend on. Without ``trace_state`` the round is built
    (every check of ``make_round``) but its state is None."""
    config = config.validate().resolved()
    shared = {} if shared is None else shared
    dataset, source = shapes_of(config, shared)
    _, _, parts, _ = client_parts(config, dataset)
    abstract = lambda a: jax.ShapeDtypeStruct(
        np.shape(a), jax.dtypes.canonicalize_dtype(
            np.float32 if np.issubdtype(np.asarray(a).dtype, np.floating) else np.int32))
    examples = FederatedData(x=jax.tree.map(abstract, dataset.x_train),
                             y=abstract(dataset.y_train), index=None, offset=None, count=None)
    data = with_parts(examples, parts)
    model_key = ("model", config.dataset, config.model, config.conv_impl, config.algorithm,
                 config.switch_to, config.options.algorithm_args.get("num_components"))
    if model_key not in shared:
        shared[model_key] = experiment_model(config, dataset)
    model = shared[model_key]
    algorithm = build_algorithm(config, model, data)
    settings = round_settings(config)
    if not config.client_chunk:
        settings["client_chunk"] = client_chunk or gpu_client_chunk(config, data.num_clients)
    round_fn = make_round(algorithm, model, data if runs is None else [data] * runs, **settings,
                          probes=build_probes(config, dataset, model, data), runs=runs,
                          run_chunk=runs)
    if trace_state and ("params", model_key) not in shared:
        shared["params", model_key] = jax.eval_shape(model.init, jax.random.PRNGKey(0))
    params = shared.get(("params", model_key))
    if not trace_state:
        state = None
    elif runs is None:
        state = jax.eval_shape(lambda p: round_fn.init_state(p, config.seed), params)
    else:
        state = jax.eval_shape(lambda p: round_fn.init_state([p] * runs, [config.seed] * runs),
                               params)
    return AbstractRound(round_fn, state, data, model, algorithm, source)


def estimate(config: ExperimentConfig, runs: int | None = None) -> Estimate:
    """Compile the config's abstract round for the host and read its costs (module docstring)."""
    built = abstract_round(config, runs)
    # LLVM's optimization of the kernels changes neither the buffers nor the FLOPs: skip it
    compiled = built.round_fn.lower(built.state).compile({"xla_backend_optimization_level": 0})
    memory = compiled.memory_analysis()
    device = (memory.argument_size_in_bytes + memory.output_size_in_bytes
              - memory.alias_size_in_bytes + memory.temp_size_in_bytes)
    flops = hlo_flops(compiled.as_text()) * active_fraction(config, built.data.num_clients)
    state = built.state
    return Estimate(params=int(sum(np.prod(a.shape) for a in jax.tree.leaves(state.params))),
                    client_state_bytes=nbytes(state.client_states),
                    state_bytes=nbytes(state),
                    data_bytes=nbytes((built.data.x, built.data.y, built.data.index,
                                       built.data.offset, built.data.count)),
                    device_bytes=int(device), flops_per_round=float(flops),
                    seconds_per_round=float(flops) / H100_FLOPS, source=built.source)


class Program(NamedTuple):
    members: list[int]          # indices of the sweep's cells that train in this program
    estimate: Estimate


def plan(configs: Sequence[ExperimentConfig], max_runs: int | None = None,
         say=None, cache: dict | None = None) -> list[Program]:
    """The programs ``configs`` train in (``fljax.runner.grouping.group``, at most ``max_runs``
    runs each), each estimated (``estimate``) once per distinct program shape (``cache``: the
    estimates by ``grouping.program_key``, kept between calls); ``say(text)`` reports
    progress."""
    groups = grouping.group(configs, max_runs or len(configs))
    done: dict[str, Estimate] = {} if cache is None else cache
    result = []
    for i, members in enumerate(groups):
        key = grouping.program_key(configs[members[0]])
        if key not in done:
            if say:
                say(f"[{i + 1}/{len(groups)}] compiling for the host: {len(done) + 1} "
                    f"program shape(s)")
            done[key] = estimate(configs[members[0]])
        result.append(Program(members, done[key]))
    return result


def gigabytes(n: float) -> str:
    return f"{n / 1e9:.2f}"


def plan_table(cells: Sequence[Any], programs: Sequence[Program],
               device_memory: float = 80e9) -> str:
    """A Markdown table of ``programs`` (``plan``) over a sweep's ``cells``
    (``fljax.runner.sweep.Cell``) and its total: runs, parameters, client state, data, device
    memory of one run and of all its runs side by side, GFLOP per round, rounds and estimated
    H100 hours (runs x rounds x seconds per round: side by side runs share the device's FLOP
    rate, so no speed-up is assumed)."""
    lines = ["| program | runs | parameters | client state, GB | data, GB | device memory, 1 run, "
             "GB | device memory, all runs side by side, GB | GFLOP / round / run | rounds | "
             "estimated H100 hours |", "|---|---|---|---|---|---|---|---|---|---|"]
    total_hours, peak, too_big = 0.0, 0, []
    for i, program in enumerate(programs):
        members = [cells[m] for m in program.members]
        e = program.estimate
        names = sorted({f"{c.row} / {c.column}" for c in members})
        what = names[0] + (f" (+{len(names) - 1} more)" if len(names) > 1 else "")
        rounds = max(c.config.rounds for c in members)
        hours = sum(c.config.rounds for c in members) * e.seconds_per_round / 3600
        together = e.program_bytes(len(members))
        total_hours += hours
        peak = max(peak, e.device_bytes)
        if e.device_bytes > device_memory:
            too_big.append(f"{i + 1}")
        lines.append(f"| {i + 1}. {what} | {len(members)} | {e.params:,} | "
                     f"{gigabytes(e.client_state_bytes)} | {gigabytes(e.data_bytes)} | "
                     f"{gigabytes(e.device_bytes)} | {gigabytes(together)} | "
                     f"{e.flops_per_round / 1e9:,.1f} | {rounds} | {hours:,.2f} |")
    runs = sum(len(p.members) for p in programs)
    summary = (f"Total: {len(programs)} programs, {runs} runs, {total_hours:,.1f} estimated H100 "
               f"hours; the largest run needs {gigabytes(peak)} GB of device memory")
    if too_big:
        summary += (f"; program(s) {', '.join(too_big)} do not fit one {device_memory / 1e9:.0f} "
                    f"GB GPU with one run: spread their clients over devices (num_devices, "
                    f"fljax.core.placement) or train their clients in chunks (client_chunk)")
    sources = sorted({p.estimate.source for p in programs})
    return "\n".join(lines) + f"\n\n{summary}.\n\nShapes from: {'; '.join(sources)}.\n\n" + (
        HOW[0].upper() + HOW[1:] + ".")
