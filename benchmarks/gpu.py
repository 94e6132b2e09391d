"""Every GPU row of the benchmarks, on synthetic data, in steps of under 10 minutes each.

    python benchmarks/gpu.py [--smoke] [--out BENCHMARKS.md] [--only STEP] [--budget SECONDS]

Steps (each its own process, killed after STEP_BUDGET seconds or --budget; its part of the report
written as soon as it ends):
  round_speed   round_speed.py's setups (a) and (b): fljax default, vmap all, sequential, limit;
  finish        the pfl-research CIFAR-10 setup (b) for its 1500 rounds: the time to finish;
  client_chunk  clients vmapped, sequential and in chunks (client_chunk 1, 5, 10, 25, 50) on (b);
  conv          per-client convolutions, XLA's (a grouped conv once vmapped) vs im2col, on (b);
  unroll        the lax.scan over local steps unrolled 1, 2, 5 (all) steps per iteration, on (b);
  dtype         bfloat16 compute with float32 parameters vs float32, on (b);
  runs          R = 1 .. 2048 digits-MLP FedAvg runs (own seed, split, lr) in one program, and
                the batched-runs target: >= 5x the run-rounds/s of R = 1 at some R >= 64;
  peers         peers.py's three workloads: fljax's default row vs pfl-research's simulation on
                the GPU (pfl_round.py in build/pfl-venv, built with a CUDA PyTorch); a line
                saying why, and no rows, when pfl or a CUDA PyTorch is not there;
  calibrate     one full-scale cell of a real sweep file per model family (VGG-11, ResNet-20,
                ConvNet2, Tiny CNN) on synthetic data of its dataset's shapes: measured s/round
                next to ``fljax.runner.estimate.estimate``'s (the ``--plan`` estimate), and their
                ratio.
Rows are timed as in round_speed.py (``timing.round_robin``: one warm-up round, then the median
of timed rounds taken round-robin). The report is the section ``GPU rows`` of --out; --only
replaces one step's part and keeps the others. It needs a GPU; --smoke runs every step at a tiny
scale on any backend (the tests run it on CPU) and needs an explicit --out.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import subprocess
import sys
import tempfile
import time
from typing import Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp

from fljax.models import DEFAULT_CONV_IMPL, ConvNet, Model, from_module
from round_speed import (NUM_CLASSES, SETUPS, Candidate, Row, Setup, default_chunk, disturbance,
                         federated, fljax_candidates, fljax_round, limit_candidate, measure,
                         synthetic_data, table, targets)
from timing import machine, read_subsections, write_subsections

import peers  # noqa: E402  (after round_speed: both in benchmarks/)

PFL_ENV = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build",
                                        "pfl-venv"))
STEP_BUDGET = 570          # seconds a full-scale step may run (under 10 minutes)
SMOKE_BUDGET = 120         # the same for a --smoke step


class Scale(NamedTuple):
    name: str                          # 'full' or 'smoke'
    setups: tuple[Setup, Setup]        # round_speed's (a) and (b)
    timed_rounds: int                  # timed rounds per row
    slow_rounds: int                   # for round_speed's slow-conv row (CPU only)
    chunks: tuple[int, ...]            # client_chunk values of the client_chunk step
    finish_rounds: int                 # rounds of the finish step's whole run
    budget: float                      # seconds a step may run
    run_counts: tuple[int, ...]        # R of the runs step
    calibrate_rounds: int              # timed rounds per family of the calibrate step


def tiny_cnn(conv_impl: str) -> Model:
    """The smoke runs' CNN on 8x8x1 images: conv3x3-4, pool, fc8, fc10."""
    module = ConvNet(channels=(4,), hidden=(8,), num_classes=NUM_CLASSES, kernel=3,
                     conv_impl=conv_impl)
    return from_module("tiny_cnn", module, (8, 8, 1), NUM_CLASSES)


def smoke_setup(setup: Setup) -> Setup:
    """``setup`` at a tiny scale: ``tiny_cnn`` on 8x8x1 images, 4 of 8 clients x 12 examples,
    3 local steps at batch 4 (by local steps or one epoch, as ``setup``)."""
    small = setup._replace(image=(8, 8, 1), channels=(4,), hidden=(8,), build=tiny_cnn,
                           model_note="tiny_cnn (conv3x3-4, pool, fc8, fc10)", num_clients=8,
                           examples_per_client=12, cohort=4, batch=4,
                           local_steps=None if setup.local_steps is None else 3)
    return small._replace(description=(
        f"smoke scale: 8x8x1, {small.cohort} of {small.num_clients} clients x "
        f"{small.examples_per_client} examples, {small.steps_per_client} steps at B{small.batch}"))


FULL = Scale("full", SETUPS, timed_rounds=10, slow_rounds=2, chunks=(1, 5, 10, 25, 50),
             finish_rounds=1500, budget=STEP_BUDGET, run_counts=(1, 8, 64, 512, 2048),
             calibrate_rounds=3)
SMOKE = Scale("smoke", tuple(smoke_setup(s) for s in SETUPS), timed_rounds=1, slow_rounds=1,
              chunks=(1, 2, 4), finish_rounds=4, budget=SMOKE_BUDGET, run_counts=(1, 2),
              calibrate_rounds=1)


# ---------------------------------------------------------------- report pieces

def run_line(scale: Scale, setup: Setup | None = None) -> str:
    """The machine, the date and how rows were timed (and the setup, if one)."""
    line = (f"Machine: {machine()}. Date: {datetime.date.today().isoformat()}. Run: "
            f"{scale.name}, median of {scale.timed_rounds} timed rounds per row after one "
            "warm-up round, rows timed round-robin.")
    if setup is not None:
        line += f" Setup {setup.tag}: {setup.description}; model `{setup.model_note}`."
    return line


def comparison_table(rows: Sequence[Row]) -> str:
    """One markdown table of a step's rows with their ratios to the default row (time / the
    default's time; '-' where no row is make_round's default) and to the limit."""
    default = next((r.seconds for r in rows if r.kind == "fljax-default"), None)
    limit = next(r.seconds for r in rows if r.kind == "limit")
    lines = ["| implementation | s/round | rounds/s | examples/s | ratio to default | "
             "ratio to limit |", "|---|---|---|---|---|---|"]
    for row in rows:
        to_default = "-" if default is None else f"{row.seconds / default:.2f}x"
        lines.append(f"| {row.label} | {row.seconds:.4f} | {1 / row.seconds:.2f} | "
                     f"{row.setup.examples_per_round / row.seconds:,.0f} | {to_default} | "
                     f"{row.seconds / limit:.2f}x |")
    return "\n".join(lines)


def compare(scale: Scale, variants: Sequence[tuple[str, bool, Callable]], note: str) -> str:
    """Time ``variants`` (label, is make_round's default, ``fn(setup, data) -> run_round``) on
    setup (b) next to its limit; the step's report: run line, ``note``, table, disturbances."""
    setup = scale.setups[1]
    data = federated(setup, *synthetic_data(setup))
    candidates = [Candidate(label + (" [default]" if default else ""),
                            "fljax-default" if default else "fljax", make(setup, data),
                            scale.timed_rounds) for label, default, make in variants]
    rows = measure(setup, candidates + [limit_candidate(setup, data, scale.timed_rounds)])
    return "\n\n".join([run_line(scale, setup), note, comparison_table(rows), disturbance(rows)])


# ---------------------------------------------------------------- steps

def step_round_speed(scale: Scale) -> str:
    """round_speed.py's fljax rows and limit (no PyTorch rows) for setups (a) and (b)."""
    rows = []
    for setup in scale.setups:
        print(setup.tag, setup.description, flush=True)
        data = federated(setup, *synthetic_data(setup))
        rows += measure(setup, fljax_candidates(setup, data, scale.timed_rounds,
                                                scale.slow_rounds))
    return "\n\n".join([
        run_line(scale), "round_speed.py's rows for this backend, without its PyTorch rows.",
        table(rows), disturbance(rows),
        "Targets:\n\n" + targets(rows, jax.default_backend() == "cpu")])


def step_finish(scale: Scale) -> str:
    """Setup (b) for all its rounds with make_round's defaults. Time to finish = the first round
    (which compiles) + the rounds' wall time: measured when median x rounds fits in 0.8 of the
    step's remaining budget, else that extrapolation."""
    started = time.perf_counter()
    setup = scale.setups[1]
    data = federated(setup, *synthetic_data(setup))
    run = fljax_round(setup, data, DEFAULT_CONV_IMPL, None)
    first = time.perf_counter()
    run()
    first = time.perf_counter() - first
    label = f"fljax defaults ({DEFAULT_CONV_IMPL} conv, client_chunk={default_chunk(setup)})"
    row = measure(setup, [Candidate(label, "fljax-default", run, scale.timed_rounds)])[0]
    rounds = scale.finish_rounds
    estimate = row.seconds * rounds
    left = scale.budget - (time.perf_counter() - started)
    if estimate < 0.8 * left:
        print(f"  running all {rounds} rounds (~{estimate:.0f} s)", flush=True)
        whole = time.perf_counter()
        for _ in range(rounds):
            run()
        whole = time.perf_counter() - whole
        measured, how = f"{whole:.2f}", f"all {rounds} rounds were run after the timed ones"
    else:
        whole, measured = estimate, "not run"
        how = (f"the whole run was not made: median x rounds ({estimate:.0f} s) exceeds 0.8 of "
               f"the step's remaining {left:.0f} s, so the time to finish is extrapolated")
    rows = "\n".join([
        f"| implementation | first round (compiles), s | median s/round | {rounds} rounds, "
        f"extrapolated (median x {rounds}), s | {rounds} rounds, measured, s | time to finish, s |",
        "|---|---|---|---|---|---|",
        f"| {row.label} | {first:.2f} | {row.seconds:.4f} | {estimate:.2f} | {measured} | "
        f"{first + whole:.2f} |"])
    cache = jax.config.jax_compilation_cache_dir
    if cache:
        how += (f"; JAX's persistent compilation cache is on ({cache}): the first round may "
                "load its program instead of compiling it")
    return "\n\n".join([
        run_line(scale, setup), f"The pfl-research CIFAR-10 benchmark (setup (b), 1500 rounds at "
        f"full scale): {rounds} rounds on this device; {how}.", rows, disturbance([row])])


def step_client_chunk(scale: Scale) -> str:
    """client_chunk c in ``scale.chunks`` on (b): c clients vmapped at a time, chunks scanned."""
    setup, impl = scale.setups[1], DEFAULT_CONV_IMPL

    def how(chunk: int) -> str:
        if chunk == 1:
            return "sequential"
        return "vmap all" if chunk == setup.cohort else f"{setup.cohort // chunk} chunks"

    variants = [(f"client_chunk={chunk} ({how(chunk)})", chunk == default_chunk(setup),
                 lambda s, d, chunk=chunk: fljax_round(s, d, impl, chunk))
                for chunk in scale.chunks]
    return compare(scale, variants, f"Clients one after another (lax.scan), side by side "
                                    f"(vmap) or in chunks; {impl} conv.")


def step_conv(scale: Scale) -> str:
    """XLA's conv vs im2col on (b), clients one after another and all vmapped."""
    setup, impl = scale.setups[1], DEFAULT_CONV_IMPL
    labels = {"xla": "xla conv", "im2col": "im2col conv (batched matmuls)"}
    ways = {1: "sequential", setup.cohort: "vmap all: per-client weights make XLA's a grouped conv"}
    variants = [(f"{labels[conv]}, client_chunk={chunk} ({way})",
                 conv == impl and chunk == default_chunk(setup),
                 lambda s, d, conv=conv, chunk=chunk: fljax_round(s, d, conv, chunk))
                for chunk, way in ways.items() for conv in labels]
    return compare(scale, variants, "Per-client convolutions, XLA's native conv or im2col "
                                    "(fljax.models.layers.im2col_conv), with the clients one after "
                                    f"another and all {setup.cohort} vmapped; on GPU a vmapped conv "
                                    "over per-client weights has a slow backward pass (jax issue "
                                    "13800).")


def step_unroll(scale: Scale) -> str:
    """make_round(unroll=u) on (b): u local steps per iteration of the scan over steps."""
    setup, impl = scale.setups[1], DEFAULT_CONV_IMPL
    steps = setup.steps_per_client
    variants = [(f"unroll={u}" + (" (all local steps)" if u == steps else ""), u == 1,
                 lambda s, d, u=u: fljax_round(s, d, impl, None, unroll=u))
                for u in sorted({1, 2, steps})]
    return compare(scale, variants, f"The lax.scan over each client's {steps} local steps "
                                    f"unrolled; make_round's defaults otherwise ({impl} conv).")


def step_dtype(scale: Scale) -> str:
    """make_round(compute_dtype=bfloat16) vs float32 on (b)."""
    impl = DEFAULT_CONV_IMPL
    variants = [("float32", True, lambda s, d: fljax_round(s, d, impl, None)),
                ("bfloat16 compute, float32 parameters", False,
                 lambda s, d: fljax_round(s, d, impl, None, compute_dtype=jnp.bfloat16))]
    return compare(scale, variants, "The model's forward and backward passes in bfloat16 over "
                                    "float32 parameters, gradients and optimizer state; the "
                                    "limit in float32.")


def step_runs(scale: Scale) -> str:
    """R runs of the README's main job (FedAvg, digits MLP, Dirichlet(0.3) over 20 clients, 10
    per round, 2 local epochs at B16), each with its own seed, split and lr, in ONE program
    (``make_round(..., runs=R)``, the runs side by side): run-rounds per second against R."""

    import fljax
    from fljax.data import dirichlet, federate, load_digits, with_parts
    from fljax.models import make_model
    from timing import round_robin

    ds = load_digits()
    model = make_model("mlp", ds.x_train.shape[1:], ds.num_classes)
    first = federate(ds.x_train, ds.y_train, dirichlet(ds.y_train, 20, 0.3, seed=0),
                     ds.num_classes)
    build = lambda h: fljax.fedavg(fljax.local_sgd(h["lr"]))
    lines = ["| runs R | first round (compiles), s | s/round | run-rounds/s | vs R = 1 |",
             "|---|---|---|---|---|"]
    single, ratios = None, {}
    for runs in scale.run_counts:
        datas = [first] + [with_parts(first, dirichlet(ds.y_train, 20, 0.3, seed=s))
                           for s in range(1, runs)]
        round_fn = fljax.make_round(build, model, datas, runs=runs, clients_per_round=10,
                                    batch_size=16, local_epochs=2)
        state = round_fn.init_state([model.init(jax.random.PRNGKey(s)) for s in range(runs)],
                                    list(range(runs)),
                                    {"lr": [0.05 * (1 + s % 4) for s in range(runs)]})

        def one_round():
            nonlocal state
            state = jax.block_until_ready(round_fn(state))[0]

        start = time.perf_counter()
        one_round()
        compiled = time.perf_counter() - start
        timing = round_robin([one_round], [scale.timed_rounds])[0]
        rate = runs / timing.seconds
        single = single or rate
        ratios[runs] = rate / single
        lines.append(f"| {runs} | {compiled:.2f} | {timing.seconds:.4f} | {rate:,.1f} | "
                     f"{rate / single:.1f}x |")
        print(lines[-1], flush=True)
    return "\n\n".join([
        run_line(scale), "The README's main job, R runs in one program, each its own seed "
        "(initial model, cohorts, batches), Dirichlet split and local lr (0.05 to 0.2, traced); "
        "the runs side by side (vmap, the default off CPU).", "\n".join(lines),
        runs_target(ratios)])


RUNS_TARGET = 5.0     # batched runs: run-rounds/s at some R >= RUNS_AT, over R = 1's
RUNS_AT = 64


def runs_target(ratios: dict[int, float]) -> str:
    """The batched-runs target's line from the runs step's {R: run-rounds/s over R = 1's}."""
    line = (f"Target (batched runs): >= {RUNS_TARGET:g}x the run-rounds/s of R = 1 at some "
            f"R >= {RUNS_AT}: ")
    counted = {r: ratio for r, ratio in ratios.items() if r >= RUNS_AT}
    if not counted:
        return line + f"not measured (no R >= {RUNS_AT} in this run)."
    best = max(counted, key=counted.get)
    at = ", ".join(f"{ratio:.1f}x at R = {r}" for r, ratio in counted.items())
    verdict = "met" if counted[best] >= RUNS_TARGET else "NOT met"
    return line + f"{verdict} (best {counted[best]:.1f}x at R = {best}; {at})."


# The calibrate step's families: (family, sweep file in experiments/, the model of its cell).
FAMILIES = (("VGG-11, CIFAR-10 cross-device", "feddyn_init_table1_cross_device.json", "vgg11"),
            ("ResNet-20, CIFAR-100", "evidence_feddyn_init.json", "resnet20"),
            ("ConvNet2, FEMNIST", "evidence_compression_natural.json", "convnet2"),
            ("Tiny CNN, Tiny-ImageNet", "fedbug_table3_tiny.json", "tiny_cnn"))
EXPERIMENTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "experiments")
SMOKE_CELL = dict(num_clients=4, clients_per_round=2, batch_size=4, local_steps=2,
                  partition="iid", validation_fraction=0.0)   # a cell at the smoke scale
SMOKE_EXAMPLES = 8                                            # per client, at the smoke scale
COMPILE_ALLOWANCE = 60    # seconds a family's compilation is assumed to take (the step's budget)


class Calibration(NamedTuple):
    family: str
    sweep_file: str
    cell: str              # the cell: row / column, grid point, seed
    work: str              # its model, data and local work
    measured: float | None    # median s/round (None: not measured, ``note`` says why)
    estimated: float | None   # the estimate's s/round
    timing: object = None     # timing.Timing of the measured rounds
    note: str = ""            # what the estimate read, and why a family was not measured
    how: str = ""             # how the estimate was made


def synthetic(data, num_classes: int, vocab: int, key: jax.Array, clients: int | None = None,
              per_client: int = SMOKE_EXAMPLES):
    """A FederatedData of values for ``data``'s abstract x and y (jax.ShapeDtypeStruct):
    floating inputs normal noise, integer inputs uniform in [0, vocab), booleans fair coins,
    labels uniform in [0, num_classes); index, offset and count as ``data``'s, or, with
    ``clients``, that many clients of ``per_client`` examples each (the same shapes per example)."""
    x, y = data.x, data.y
    if clients is not None:
        n = clients * per_client
        resize = lambda a: jax.ShapeDtypeStruct((n, *a.shape[1:]), a.dtype)
        x, y = jax.tree.map(resize, x), resize(y)
        data = data._replace(index=jnp.arange(n, dtype=jnp.int32),
                             offset=jnp.arange(clients, dtype=jnp.int32) * per_client,
                             count=jnp.full((clients,), per_client, jnp.int32))
    leaves, tree = jax.tree.flatten(x)
    keys = jax.random.split(key, len(leaves) + 1)

    def fill(a, k):
        if jnp.issubdtype(a.dtype, jnp.floating):
            return jax.random.normal(k, a.shape, a.dtype)
        if a.dtype == jnp.bool_:
            return jax.random.bernoulli(k, 0.5, a.shape)
        return jax.random.randint(k, a.shape, 0, vocab, a.dtype)

    return data._replace(x=tree.unflatten([fill(a, k) for a, k in zip(leaves, keys[1:])]),
                         y=jax.random.randint(keys[0], y.shape, 0, num_classes, y.dtype))


def vocabulary(model: Model) -> int:
    """The token count of integer inputs: the rows of the model's smallest embedding table
    (2 if it has none)."""
    shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0))
    return min((leaf.shape[0] for path, leaf in jax.tree_util.tree_leaves_with_path(shapes)
                if "embed" in jax.tree_util.keystr(path).lower() and leaf.ndim == 2), default=2)


def work_of(config) -> str:
    """A cell's model, data and local work in a few words."""
    local = (f"{config.local_steps} local steps" if config.local_steps is not None else
             f"{config.local_epochs:g} local epochs")
    return (f"{config.model} on {config.dataset}, {config.clients_per_round} of "
            f"{config.num_clients} clients ({config.partition}), {local} at B{config.batch_size}")


def calibrate(family: str, sweep_file: str, model_name: str, scale: Scale,
              left: float) -> Calibration:
    """One family: the first cell of ``sweep_file`` at scale 'full' whose model is
    ``model_name`` (shrunk to SMOKE_CELL at the smoke scale), trained on synthetic data of its
    dataset's shapes for one warm-up and ``scale.calibrate_rounds`` timed rounds, next to its
    estimate. At full scale it is not run when the estimate says it would not fit in ``left``
    seconds (COMPILE_ALLOWANCE + a warm-up and twice the timed rounds)."""
    from fljax import make_round
    from fljax.runner import estimate, experiment, sweep
    from timing import round_robin

    with tempfile.TemporaryDirectory() as folder:
        cells = sweep.cells(sweep.load_sweep(os.path.join(EXPERIMENTS, sweep_file)), "full",
                            folder)
    cell = next(c for c in cells if c.config.model == model_name)
    config = cell.config
    if scale.name == "smoke":
        config = config.replace(**SMOKE_CELL).validate()
    name = " / ".join([cell.row, cell.column] + [f"{k}={v}" for k, v in cell.setting])
    found = Calibration(family, sweep_file, f"{name}, seed {cell.seed}", work_of(config), None,
                        None)
    guess = estimate.estimate(config)
    found = found._replace(estimated=guess.seconds_per_round, how=guess.how, note=(
        f"estimated from {guess.source}: {guess.flops_per_round / 1e9:,.2f} GFLOP per round, "
        f"{guess.device_bytes / 2**30:.2f} GiB on the device"))
    needed = COMPILE_ALLOWANCE + (1 + 2 * scale.calibrate_rounds) * guess.seconds_per_round
    if scale.name != "smoke" and needed > left:
        return found._replace(note=found.note + f"; not measured: at the estimate, {needed:.0f} "
                                                f"s (with {COMPILE_ALLOWANCE} s to compile) "
                                                f"exceed the step's remaining {left:.0f} s")
    abstract = estimate.abstract_round(config)
    model = abstract.model
    data = synthetic(abstract.data, model.num_classes, vocabulary(model), jax.random.PRNGKey(1),
                     clients=config.num_clients if scale.name == "smoke" else None)
    round_fn = make_round(experiment.build_algorithm(config, model, data), model, data,
                          **experiment.round_settings(config), num_devices=config.num_devices,
                          probes=experiment.build_probes(config, None, model, data))
    state = round_fn.init_state(model.init(jax.random.PRNGKey(0)), 0)

    def one_round():
        nonlocal state
        state = jax.block_until_ready(round_fn(state))[0]

    timing = round_robin([one_round], [scale.calibrate_rounds])[0]
    return found._replace(measured=timing.seconds, timing=timing)


def calibration_table(found: Sequence[Calibration]) -> str:
    """The calibrate step's table: measured and estimated s/round and their ratio."""
    def number(v: float | None) -> str:     # 4 decimals, or 3 significant digits if fewer
        if v is None:
            return "-"
        return f"{v:.{max(4, 2 - math.floor(math.log10(v))) if v > 0 else 4}f}"

    lines = ["| family | sweep file | cell | work | measured s/round | estimated s/round | "
             "measured / estimated |", "|---|---|---|---|---|---|---|"]
    for c in found:
        ratio = ("-" if c.measured is None or not c.estimated else
                 f"{c.measured / c.estimated:,.2f}x")
        lines.append(f"| {c.family} | {c.sweep_file} | {c.cell} | {c.work} | "
                     f"{number(c.measured)} | {number(c.estimated)} | {ratio} |")
    return "\n".join(lines)


def step_calibrate(scale: Scale) -> str:
    """Each family of FAMILIES: measured s/round of one full-scale cell next to its estimate."""
    started, found = time.perf_counter(), []
    for family, sweep_file, model_name in FAMILIES:
        print(f"  {family} ({sweep_file})", flush=True)
        left = scale.budget - (time.perf_counter() - started)
        try:
            found.append(calibrate(family, sweep_file, model_name, scale, left))
        except Exception as e:      # the report says which family failed and why
            found.append(Calibration(family, sweep_file, "-", "-", None, None,
                                     note=f"failed: {type(e).__name__}: {e}"))
        print(calibration_table(found[-1:]).splitlines()[-1], flush=True)
    notes = []
    for c in found:
        note = c.note
        if c.timing is not None and c.timing.disturbed:
            note += (f"; {c.timing.disturbed} timed rounds disturbed by other processes, "
                     f"median over {c.timing.clean} clean ones")
        notes.append(f"- {c.family}: {note or 'no note'}.")
    smoke = (" At the smoke scale each cell is shrunk to 2 of 4 IID clients of "
             f"{SMOKE_EXAMPLES} examples, 2 local steps at B4 (the real model), and so is its "
             "estimate." if scale.name == "smoke" else "")
    return "\n\n".join([
        run_line(scale._replace(timed_rounds=scale.calibrate_rounds)),
        "For each model family, one cell of a real sweep file at its `full` scale (the first "
        "with that model), trained on synthetic data of its dataset's shapes (normal noise inputs, uniform labels) with the cell's algorithm, local work, "
        "augmentation and probes, as the runner builds its round; measured: the median of "
        f"{scale.calibrate_rounds} timed rounds after one warm-up round; estimated: "
        "`fljax.runner.estimate.estimate(config).seconds_per_round` (the `--plan` estimate, in "
        "H100 seconds) for the same cell. A ratio above 1x: the estimate is optimistic." + smoke,
        calibration_table(found), "\n".join(notes)] + [
            f"How the estimates are made: {how}." for how in dict.fromkeys(
                c.how for c in found if c.how)])


def step_peers(scale: Scale) -> str:
    """peers.py's workloads (at the smoke scale: 4 of 8 clients x 12 examples, batch 4), fljax's
    default row next to pfl-research's simulation on the GPU; skipped, with a line saying why,
    when pfl-research's environment has no CUDA PyTorch."""
    why = peers.pfl_on_gpu(PFL_ENV)
    if why:
        return "\n\n".join([run_line(scale), f"Skipped: {why}."])
    rows = []
    for setup in peers.WORKLOADS:
        if scale.name == "smoke":
            setup = setup._replace(num_clients=8, examples_per_client=12, cohort=4, batch=4,
                                   description=f"{setup.description} (smoke scale: 4 of 8 "
                                               "clients x 12 examples, 1 epoch at B4)")
        print(setup.tag, setup.description, flush=True)
        workers = []
        try:
            rows += measure(setup, peers.gpu_candidates(setup, PFL_ENV, scale.timed_rounds,
                                                        workers))
        finally:
            for worker in workers:
                worker.close()
    return "\n\n".join([
        run_line(scale), "peers.py's workloads (full scale: FedAvg, 1 local epoch at batch 10, lr 0.05, "
        "cohort 100 of 1000 clients x 50 examples) with fljax's default round (all clients "
        "vmapped on GPU) and pfl-research's own simulation in one process on the GPU "
        "(`benchmarks/pfl_round.py`, clients one after another as pfl trains them), each "
        "round timed from request to answer as in peers.py.", peers.table(rows),
        disturbance(rows)])


STEPS = {   # name: (title in the report, the step)
    "round_speed": ("1. Setups (a) and (b): default, vmap all, sequential, limit",
                    step_round_speed),
    "finish": ("2. The pfl-research CIFAR-10 setup (b): time to finish its rounds", step_finish),
    "client_chunk": ("3. Clients vmapped, sequential, chunked on (b)", step_client_chunk),
    "conv": ("4. Per-client convolutions on (b): xla vs im2col", step_conv),
    "unroll": ("5. Unrolled local steps on (b)", step_unroll),
    "dtype": ("6. bfloat16 compute on (b)", step_dtype),
    "runs": ("7. Many runs in one program (digits MLP)", step_runs),
    "peers": ("8. fljax vs pfl-research on peers.py's workloads", step_peers),
    "calibrate": ("9. Calibration: measured s/round against the estimate", step_calibrate),
}

HEADING = "GPU rows (`benchmarks/gpu.py`)"

HEADER = f"""Every GPU comparison in one command, `python benchmarks/gpu.py` (`--only STEP` reruns
one step and keeps the other parts), on synthetic data with FedAvg and plain local SGD (lr 0.05) as
in round_speed.py, whose setups (a) and (b) these are. Each step runs in its own process, stopped
after {STEP_BUDGET} s (or `--budget`). Rows are timed as in round_speed.py: one warm-up round
(which compiles), then the median of timed rounds taken round-robin over a step's rows, each waited
for. In steps 3-6, `[default]` marks what `make_round` does without the option, "ratio to default"
is a row's time over that row's, and the limit is round_speed.py's: the same SGD steps in ONE
jitted `lax.scan` with no FL logic. Step 7 holds the batched-runs target (>= {RUNS_TARGET:g}x
the run-rounds/s of R = 1 at some R >= {RUNS_AT}); step 9 measures real sweep cells against the
`--plan` estimate.
"""


def placeholder(name: str) -> str:
    return (f"To be measured: run `python benchmarks/gpu.py` (or `--only {name}`) on a GPU "
            "machine.")


# ---------------------------------------------------------------- running the steps

def run_step(name: str, smoke: bool, budget: float) -> tuple[str, bool]:
    """(step ``name``'s report part, whether it finished): the step in a child process, killed
    after ``budget`` seconds; at the smoke scale in this process (the steps share programs)."""
    if smoke:
        try:
            return STEPS[name][1](SMOKE), True
        except Exception as e:      # the report says which step failed and why
            return f"Failed: {type(e).__name__}: {e}", False
    with tempfile.TemporaryDirectory() as folder:
        part = os.path.join(folder, "part.md")
        command = [sys.executable, __file__, "--only", name, "--part", part, "--budget",
                   str(budget)]
        try:
            done = subprocess.run(command + (["--smoke"] if smoke else []), timeout=budget)
        except subprocess.TimeoutExpired:
            return f"Not finished: the step was stopped after {budget:.0f} s.", False
        if done.returncode:
            return f"Failed: the step exited with status {done.returncode}.", False
        with open(part) as f:
            return f.read().strip(), True


def backend() -> str:
    """jax's default backend, asked of a child process: this one holds no device."""
    return subprocess.run([sys.executable, "-c", "import jax; print(jax.default_backend())"],
                          capture_output=True, text=True, check=True).stdout.strip()


def write_part(out: str, name: str, text: str) -> None:
    """Replace step ``name``'s part of the report in ``out``, keeping every other step's."""
    old = read_subsections(out, HEADING)
    parts = {title: old.get(title, placeholder(key)) for key, (title, _) in STEPS.items()}
    parts[STEPS[name][0]] = text
    write_subsections(out, HEADING, HEADER, parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true",
                        help="every step at a tiny scale on any backend (needs --out)")
    parser.add_argument("--out", help="markdown report to write (default: BENCHMARKS.md)")
    parser.add_argument("--only", choices=list(STEPS), help="run this step alone")
    parser.add_argument("--budget", type=float, help=f"seconds a step may run (default "
                        f"{STEP_BUDGET}; {SMOKE_BUDGET} with --smoke)")
    parser.add_argument("--part", help=argparse.SUPPRESS)   # a child: write the step's part here
    args = parser.parse_args(argv)
    scale = SMOKE if args.smoke else FULL
    if args.budget is not None:
        if not 0 < args.budget <= STEP_BUDGET:
            parser.exit(2, f"gpu.py: --budget {args.budget:g} is not allowed: a step may run "
                           f"more than 0 and at most {STEP_BUDGET} seconds\n")
        scale = scale._replace(budget=args.budget)
    if args.part:
        with open(args.part, "w") as f:
            f.write(STEPS[args.only][1](scale))
        return 0
    if not args.smoke and (found := backend()) != "gpu":
        parser.exit(2, f"gpu.py: needs a GPU (jax's backend here is {found}); --smoke --out "
                       "FILE runs a tiny version anywhere\n")
    if args.smoke and not args.out:
        parser.exit(2, "gpu.py: --smoke needs --out (smoke numbers do not belong in "
                       "BENCHMARKS.md)\n")
    out = args.out or "BENCHMARKS.md"
    if args.smoke and not jax.config.jax_compilation_cache_dir:   # programs shared by steps
        jax.config.update("jax_compilation_cache_dir", os.path.join(
            tempfile.gettempdir(), "fljax-gpu-smoke-xla-cache"))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    failed = []
    for name in [args.only] if args.only else list(STEPS):
        print(f"== {STEPS[name][0]}", flush=True)
        started = time.perf_counter()
        text, finished = run_step(name, args.smoke, scale.budget)
        print(f"== {name}: {time.perf_counter() - started:.0f} s", flush=True)
        write_part(out, name, text)
        failed += [] if finished else [name]
    print(f"written to {out}" + (f"; not finished: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
