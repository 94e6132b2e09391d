"""Per-round speed of fljax FedAvg next to its limit and a PyTorch per-client loop.

    python benchmarks/round_speed.py [--quick] [--torch/--no-torch] [--out BENCHMARKS.md]

Two setups, FedAvg with plain local SGD (lr 0.05) on synthetic data:
  (a) small_cnn on 28x28x1, 10 clients x 1600 examples, all 10 per round, 50 local steps at B32;
  (b) the pfl-research CIFAR-10 benchmark scaled to CPU: 32x32x3, 1000 clients x 50 examples,
      cohort 50, 1 local epoch at batch 10 (5 steps), a 2-conv CNN (ConvNet(channels=(32, 64),
      hidden=(512,), kernel=5)).
Rows per setup: fljax with sequential clients (client_chunk=1) and with all clients vmapped
(client_chunk=cohort); for (a) on CPU also XLA's native conv inside the scan; the "limit" (the
same gradient steps in ONE jitted lax.scan of plain SGD, no FL logic); and a plain PyTorch loop
over clients. Each row runs one warm-up (compile) round; then timed rounds, always waited for
(``jax.block_until_ready``), are taken round-robin over a setup's rows, and a row's time is their
median. Rounds during which other processes used the CPU are dropped and rerun (a shared machine).
The report is printed and written to --out: the section of the current backend (CPU or GPU) is
replaced, the other one is kept.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import functools
from typing import Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

import fljax
from fljax.models import (DEFAULT_CONV_IMPL, ConvNet, Model, cross_entropy, from_module,
                          make_model, num_params)
from timing import DISTURBED, machine, read_subsections, round_robin, write_subsections

LEARNING_RATE = 0.05
TORCH_THREADS = 2
NUM_CLASSES = 10
TARGET_LIMIT_RATIO = 1.1     # fljax round <= 1.1x the limit
TARGET_TORCH_SPEEDUP = 2.5   # fljax >= 2.5x faster than the PyTorch loop (CPU)


class Setup(NamedTuple):
    tag: str                          # '(a)', '(b)'
    description: str
    model_note: str
    image: tuple[int, int, int]       # H, W, C
    channels: tuple[int, ...]         # the CNN's conv widths (also used for the torch model)
    hidden: tuple[int, ...]           # its dense widths before the output layer
    build: Callable[[str], Model]     # conv_impl -> the fljax model
    num_clients: int
    examples_per_client: int
    cohort: int
    batch: int
    local_steps: int | None
    local_epochs: int | None
    slow_conv_row: bool               # add the XLA-conv-inside-scan row (CPU)

    @property
    def steps_per_client(self) -> int:
        if self.local_steps is not None:
            return self.local_steps
        return self.local_epochs * -(-self.examples_per_client // self.batch)

    @property
    def examples_per_round(self) -> int:
        return self.cohort * self.steps_per_client * self.batch


def pfl_cnn(conv_impl: str) -> Model:
    module = ConvNet(channels=(32, 64), hidden=(512,), num_classes=NUM_CLASSES, kernel=5,
                     conv_impl=conv_impl)
    return from_module("pfl_cnn", module, (32, 32, 3), NUM_CLASSES)


SETUPS = (
    Setup(tag="(a)", description="28x28x1, 10 of 10 clients x 1600 examples, 50 steps at B32",
          model_note="make_model('small_cnn', (28, 28, 1), 10)", image=(28, 28, 1),
          channels=(16, 32), hidden=(128,),
          build=lambda impl: make_model("small_cnn", (28, 28, 1), NUM_CLASSES, impl),
          num_clients=10, examples_per_client=1600, cohort=10, batch=32, local_steps=50,
          local_epochs=None, slow_conv_row=True),
    Setup(tag="(b)", description="pfl-research benchmark scaled to CPU: 32x32x3, 50 of 1000 "
                                 "clients x 50 examples, 1 epoch at B10",
          model_note="from_module(ConvNet(channels=(32, 64), hidden=(512,), num_classes=10, "
                     "kernel=5))", image=(32, 32, 3),
          channels=(32, 64), hidden=(512,), build=pfl_cnn,
          num_clients=1000, examples_per_client=50, cohort=50, batch=10, local_steps=None,
          local_epochs=1, slow_conv_row=False),
)


class Candidate(NamedTuple):
    label: str
    kind: str                         # 'fljax', 'fljax-default', 'limit' or 'torch'
    run_round: Callable[[], None]     # runs one round and waits for it
    rounds: int                       # timed rounds wanted


class Row(NamedTuple):
    setup: Setup
    label: str
    kind: str            # 'fljax', 'fljax-default', 'limit' or 'torch'
    seconds: float       # median wall time of one round
    clean: int           # timed rounds the median is over
    disturbed: int       # timed rounds dropped: other processes used the CPU meanwhile


# ---------------------------------------------------------------- data and timing

def synthetic_data(setup: Setup, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian images and uniform labels; client i holds the i-th contiguous block."""
    rng = np.random.default_rng(seed)
    n = setup.num_clients * setup.examples_per_client
    x = rng.standard_normal((n, *setup.image), dtype=np.float32)
    return x, rng.integers(0, NUM_CLASSES, n).astype(np.int32)


def federated(setup: Setup, x: np.ndarray, y: np.ndarray) -> fljax.FederatedData:
    """``setup``'s clients over ``synthetic_data``'s arrays: client i holds the i-th block."""
    return fljax.federate(x, y, np.split(np.arange(len(y)), setup.num_clients), NUM_CLASSES)


def cost_benchmark(description: str, unit: str, untimed: bool = False
                   ) -> tuple[argparse.Namespace, int, Setup, fljax.FederatedData]:
    """The cost benchmarks' shared start: their command line (--quick: one timed round per
    ``unit``; --out; with ``untimed``, --no-timing: the counted costs only), the rounds to time,
    and the first setup with its federated data."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help=f"one timed round per {unit}")
    if untimed:
        parser.add_argument("--no-timing", action="store_true",
                            help="only what is counted, not timed (FLOPs, bytes, state): needs "
                                 "no quiet machine")
    parser.add_argument("--out", default="BENCHMARKS.md", help="markdown report to write")
    args = parser.parse_args()
    setup = SETUPS[0]
    return args, 1 if args.quick else 5, setup, federated(setup, *synthetic_data(setup))


def measure(setup: Setup, candidates: Sequence[Candidate]) -> list[Row]:
    """Time the candidates side by side (``timing.round_robin``), one Row each."""
    timings = round_robin([c.run_round for c in candidates], [c.rounds for c in candidates])
    rows = []
    for candidate, t in zip(candidates, timings):
        rows.append(Row(setup, candidate.label, candidate.kind, t.seconds, t.clean, t.disturbed))
        print(f"  {candidate.label}: {t.seconds:.3f} s/round ({t.clean} clean rounds, "
              f"{t.disturbed} disturbed)", flush=True)
    return rows


# ---------------------------------------------------------------- fljax and its limit

def fljax_round_fn(setup: Setup, data: fljax.FederatedData, conv_impl: str,
                   client_chunk: int | None, **options) -> fljax.RoundFunction:
    """fljax's FedAvg round on ``setup`` (``client_chunk=None``: make_round's default for the
    backend; ``options``: more of make_round's keyword arguments)."""
    algorithm = fljax.fedavg(fljax.local_sgd(LEARNING_RATE))
    return fljax.make_round(algorithm, setup.build(conv_impl), data,
                            clients_per_round=setup.cohort, batch_size=setup.batch,
                            local_steps=setup.local_steps, local_epochs=setup.local_epochs,
                            client_chunk=client_chunk, **options)


def initial_state(round_fn: fljax.RoundFunction) -> fljax.RoundState:
    """The benchmarks' round 0: the model initialised from key 0, seed 0."""
    return round_fn.init_state(round_fn.model.init(jax.random.key(0)), seed=0)


def fljax_round(setup: Setup, data: fljax.FederatedData, conv_impl: str,
                client_chunk: int | None, **options) -> Callable[[], None]:
    """A closure running one FedAvg round of fljax and waiting for it (as ``fljax_round_fn``)."""
    round_fn = fljax_round_fn(setup, data, conv_impl, client_chunk, **options)
    return runner(round_fn, initial_state(round_fn))


def runner(round_fn: fljax.RoundFunction, state: fljax.RoundState) -> Callable[[], None]:
    """A closure running the next round from ``state`` and waiting for it."""
    def run():
        nonlocal state
        state, metrics = round_fn(state)
        jax.block_until_ready((state, metrics))

    return run


def limit_round(setup: Setup, data: fljax.FederatedData, conv_impl: str) -> Callable[[], None]:
    """The same number of SGD steps (cohort x local steps) as ONE jitted lax.scan, batches taken
    by dynamic_slice from the device array: no sampling, masking or aggregation."""
    model = setup.build(conv_impl)
    steps, batch = setup.cohort * setup.steps_per_client, setup.batch

    def loss(params, x, y):
        return cross_entropy(model.apply(params, x, train=True), y)

    @functools.partial(jax.jit, donate_argnums=0)
    def train(params, x, y):
        def step(params, k):
            xb = jax.lax.dynamic_slice_in_dim(x, k * batch, batch)
            yb = jax.lax.dynamic_slice_in_dim(y, k * batch, batch)
            grads = jax.grad(loss)(params, xb, yb)
            return jax.tree.map(lambda w, g: w - LEARNING_RATE * g, params, grads), None

        return jax.lax.scan(step, params, jnp.arange(steps))[0]

    params = model.init(jax.random.key(0))

    def run():
        nonlocal params
        params = jax.block_until_ready(train(params, data.x, data.y))

    return run


def default_chunk(setup: Setup) -> int:
    """make_round's default client_chunk for ``setup`` on this backend (one device): 1 on CPU,
    the whole cohort elsewhere."""
    return 1 if jax.default_backend() == "cpu" else setup.cohort


def fljax_candidates(setup: Setup, data: fljax.FederatedData, timed_rounds: int,
                     slow_rounds: int) -> list[Candidate]:
    """fljax with client_chunk 1 and cohort (the backend's conv), the slow-conv row (timed for
    ``slow_rounds``), the limit."""
    backend = jax.default_backend()
    impl = DEFAULT_CONV_IMPL
    variants = [(impl, 1, timed_rounds), (impl, setup.cohort, timed_rounds)]
    if setup.slow_conv_row and backend == "cpu":
        variants.append(("xla", 1, slow_rounds))
    candidates = []
    for conv_impl, chunk, rounds in variants:
        is_default = conv_impl == impl and chunk == default_chunk(setup)
        how = "sequential" if chunk == 1 else "vmap all"
        label = (f"fljax, {conv_impl} conv, client_chunk={chunk} ({how})"
                 + (" [default]" if is_default else ""))
        candidates.append(Candidate(label, "fljax-default" if is_default else "fljax",
                                    fljax_round(setup, data, conv_impl, chunk), rounds))
    return candidates + [limit_candidate(setup, data, timed_rounds)]


def limit_candidate(setup: Setup, data: fljax.FederatedData, timed_rounds: int) -> Candidate:
    """The limit (``limit_round``) with the backend's default conv, as a row to time."""
    impl = DEFAULT_CONV_IMPL
    steps = setup.cohort * setup.steps_per_client
    return Candidate(f"limit: one lax.scan of {steps} SGD steps ({impl} conv)", "limit",
                     limit_round(setup, data, impl), timed_rounds)


# ---------------------------------------------------------------- PyTorch

def torch_model(setup: Setup, kernel: int = 5):
    """The same CNN in torch (NCHW): [conv -> ReLU -> maxpool2] per channel width, dense layers."""
    from torch import nn

    height, width, in_channels = setup.image
    layers = []
    for channels in setup.channels:
        layers += [nn.Conv2d(in_channels, channels, kernel), nn.ReLU(), nn.MaxPool2d(2)]
        in_channels, height, width = channels, (height - kernel + 1) // 2, (width - kernel + 1) // 2
    layers.append(nn.Flatten())
    features = in_channels * height * width
    for hidden in setup.hidden:
        layers += [nn.Linear(features, hidden), nn.ReLU()]
        features = hidden
    layers.append(nn.Linear(features, NUM_CLASSES))
    return nn.Sequential(*layers)


def torch_data(x: np.ndarray, y: np.ndarray, device: str = "cpu"):
    """(images as a torch NCHW tensor, labels as int64) on ``device``, from NHWC numpy arrays."""
    import torch

    xs = torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2))).to(device)
    return xs, torch.from_numpy(y.astype(np.int64)).to(device)


def torch_local_sgd(setup: Setup, model, client_x, client_y) -> None:
    """Train the torch ``model`` in place on one client's tensors: ``setup``'s local steps of
    torch.optim.SGD on batches from a fresh random permutation each epoch."""
    import torch

    n, per_epoch = len(client_y), -(-len(client_y) // setup.batch)
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    for step in range(setup.steps_per_client):
        if step % per_epoch == 0:
            order = torch.randperm(n, device=client_y.device)
        batch = order[step % per_epoch * setup.batch:][:setup.batch]
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(client_x[batch]), client_y[batch])
        loss.backward()
        optimizer.step()


def torch_round(setup: Setup, x: np.ndarray, y: np.ndarray) -> Callable[[], None]:
    """A closure running one FedAvg round as a plain per-client PyTorch loop: a fresh copy of the
    global model per client, torch.optim.SGD, shuffled batches each epoch, state_dicts averaged."""
    import torch

    torch.set_num_threads(TORCH_THREADS)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    xs, ys = torch_data(x, y, device)
    global_model = torch_model(setup).to(device)
    n = setup.examples_per_client
    rng = np.random.default_rng(0)

    def train_client(client: int):
        model = copy.deepcopy(global_model)
        torch_local_sgd(setup, model, xs[client * n:(client + 1) * n],
                        ys[client * n:(client + 1) * n])
        return model.state_dict()

    def run():
        cohort = rng.choice(setup.num_clients, setup.cohort, replace=False)
        total = {k: torch.zeros_like(v) for k, v in global_model.state_dict().items()}
        for client in cohort:
            state = train_client(int(client))
            with torch.no_grad():
                for k, v in state.items():
                    total[k] += v / setup.cohort
        global_model.load_state_dict(total)
        if device == "cuda":
            torch.cuda.synchronize()

    return run


def check_same_size(setup: Setup) -> None:
    """The torch model must have exactly as many parameters as the fljax one."""
    ours = num_params(setup.build("im2col").init(jax.random.key(0)))
    theirs = sum(p.numel() for p in torch_model(setup).parameters())
    if ours != theirs:
        raise RuntimeError(f"{setup.tag}: fljax model has {ours} parameters, torch {theirs}")


# ---------------------------------------------------------------- report

def table(rows: Sequence[Row]) -> str:
    """One markdown table; a setup's first row describes it and names its model."""
    lines = ["| setup | implementation | s/round | rounds/s | examples/s | ratio to limit | "
             "speed-up vs PyTorch |", "|---|---|---|---|---|---|---|"]
    for i, row in enumerate(rows):
        same = [r for r in rows if r.setup is row.setup]
        limit = next(r.seconds for r in same if r.kind == "limit")
        torch_seconds = next((r.seconds for r in same if r.kind == "torch"), None)
        speedup = "-" if torch_seconds is None else f"{torch_seconds / row.seconds:.2f}x"
        setup = row.setup.tag
        if i == 0 or rows[i - 1].setup is not row.setup:
            setup += f" {row.setup.description}; model `{row.setup.model_note}`"
        lines.append(f"| {setup} | {row.label} | {row.seconds:.3f} | "
                     f"{1 / row.seconds:.2f} | {row.setup.examples_per_round / row.seconds:,.0f} | "
                     f"{row.seconds / limit:.2f}x | {speedup} |")
    return "\n".join(lines)


def verdict(ok: bool) -> str:
    return "**met**" if ok else "**NOT met**"


def targets(rows: Sequence[Row], on_cpu: bool) -> str:
    """The issue's targets next to the measured ratios, for the default fljax row and, where it
    differs, the fastest fljax row."""
    lines = []
    for setup in dict.fromkeys(r.setup for r in rows):
        same = [r for r in rows if r.setup is setup]
        limit = next(r.seconds for r in same if r.kind == "limit")
        torch_seconds = next((r.seconds for r in same if r.kind == "torch"), None)
        default = next(r for r in same if r.kind == "fljax-default")
        best = min((r for r in same if r.kind.startswith("fljax")), key=lambda r: r.seconds)
        for title, row in [("default", default)] + ([("fastest", best)] if best != default else []):
            ratio = row.seconds / limit
            lines.append(f"- {setup.tag} {title} fljax row ({row.label}): round / limit = "
                         f"{ratio:.2f}x, target <= {TARGET_LIMIT_RATIO}x: "
                         f"{verdict(ratio <= TARGET_LIMIT_RATIO)}")
            if torch_seconds is None:
                continue
            speedup = torch_seconds / row.seconds
            target = (f"target >= {TARGET_TORCH_SPEEDUP}x on CPU: "
                      f"{verdict(speedup >= TARGET_TORCH_SPEEDUP)}" if on_cpu
                      else "(the target is for CPU)")
            lines.append(f"  - PyTorch round / fljax round = {speedup:.2f}x, {target}")
    return "\n".join(lines)


HEADING = "Round speed (`benchmarks/round_speed.py`)"

HEADER = """Wall time of one FedAvg communication round (plain local SGD, lr 0.05) on synthetic
data, measured side by side in one run of `python benchmarks/round_speed.py`: per row one warm-up
round (which compiles), then several timed rounds, each waited for with `jax.block_until_ready`,
taken round-robin over the rows of a setup so that a drift in the machine's speed hits all rows
alike; a row's s/round is the median. A timed round during which other processes took more than 0.1
of a core (from `/proc/stat`) is dropped and rerun, at most once per planned round; the report lists
such rows. examples/s counts the examples processed by local steps: clients per round x local steps
x batch size, divided by the round time.

- **(a)** `make_model('small_cnn', (28, 28, 1), 10)` on 28x28x1 images; 10 clients x 1600
  examples, all 10 sampled per round, 50 local steps at batch 32 (16,000 examples per round).
- **(b)** the pfl-research CIFAR-10 benchmark scaled to CPU: 32x32x3 images, 1000 clients x 50
  examples, cohort 50 per round, 1 local epoch at batch 10 (5 steps; 2,500 examples per round);
  model `fljax.models.from_module(ConvNet(channels=(32, 64), hidden=(512,), num_classes=10,
  kernel=5))` (conv5x5-32, pool, conv5x5-64, pool, fc512, fc10).

Rows: fljax with `client_chunk=1` (clients one after another in a `lax.scan`) and
`client_chunk=cohort` (all clients side by side in a `vmap`), with fljax's default conv (im2col, on
every backend); `[default]` marks what `make_round` picks when
`client_chunk` is not given. On CPU, (a) also runs XLA's native conv inside the scan (few rounds
timed: it is the slow path of jax issue 12868). **limit**: the same number of gradient steps
(clients x local steps, same model and batch size) in ONE jitted `lax.scan` of plain SGD with no FL
logic (no sampling, masking or aggregation; batches by `dynamic_slice` from a device array).
**PyTorch**: the same architecture in torch (NCHW Conv2d/MaxPool2d/Linear), a plain Python loop
over the sampled clients, a fresh copy of the global model per client, `torch.optim.SGD`, shuffled
batches by tensor indexing, state_dicts averaged after the round, `torch.set_num_threads(2)`.

Targets of the issue: an fljax round takes <= 1.1x the limit; fljax is >= 2.5x faster than the
PyTorch loop on CPU.
"""

PLACEHOLDERS = {
    "CPU": "To be measured: run `python benchmarks/round_speed.py` on a CPU-only machine.",
    "GPU": "GPU rows are measured by `python benchmarks/gpu.py` on a GPU machine: setups (a) and "
           "(b) and the other GPU comparisons are in the section GPU rows (`benchmarks/gpu.py`).",
}


def disturbance(rows: Sequence[Row]) -> str:
    """Which rows lost timed rounds to other processes' CPU use (see ``measure``)."""
    hit = [r for r in rows if r.disturbed]
    if not hit:
        return (f"No timed round was disturbed (other processes took <= {DISTURBED} of a core "
                "during every timed round).")
    lines = [f"Timed rounds during which other processes took > {DISTURBED} of a core were dropped "
             "and rerun (at most once per planned round):"]
    for row in hit:
        what = ("NO clean round: the median is over disturbed rounds, read it as an upper bound"
                if not row.clean else f"median over the {row.clean} clean rounds")
        lines.append(f"- {row.setup.tag} {row.label}: {row.disturbed} disturbed, {what}")
    return "\n".join(lines)


def section(rows: Sequence[Row], quick: bool, timed_rounds: int, slow_rounds: int,
            torch_note: str) -> str:
    on_cpu = jax.default_backend() == "cpu"
    run = "`--quick`" if quick else "full"
    return "\n\n".join([
        f"Machine: {machine()}; {torch_note}. Date: {datetime.date.today().isoformat()}. "
        f"Run: {run}, median of {timed_rounds} timed rounds per row ({slow_rounds} for the "
        "XLA-conv row), after one warm-up round each.",
        table(rows),
        disturbance(rows),
        "Targets:\n\n" + targets(rows, on_cpu)])


def write_report(path: str, backend_section: str) -> None:
    """Write this benchmark's section of ``path``: this backend's part is replaced, the other
    backend's is kept (or a placeholder); the file's other sections are left alone."""
    old = read_subsections(path, HEADING)
    parts = {name: old.get(name, placeholder) for name, placeholder in PLACEHOLDERS.items()}
    parts["GPU" if jax.default_backend() == "gpu" else "CPU"] = backend_section
    write_subsections(path, HEADING, HEADER, parts)


# ---------------------------------------------------------------- main

def torch_status(wanted: bool) -> tuple[bool, str]:
    """(whether the PyTorch rows run, a note for the report: torch's version or why not)."""
    if not wanted:
        return False, "PyTorch rows skipped (--no-torch)"
    try:
        import torch
    except ImportError as error:
        return False, f"PyTorch rows skipped (import torch failed: {error})"
    return True, f"torch {torch.__version__}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer timed rounds (~2 minutes)")
    parser.add_argument("--torch", action=argparse.BooleanOptionalAction, default=True,
                        help="time the PyTorch per-client loop (default: yes)")
    parser.add_argument("--out", default="BENCHMARKS.md", help="markdown report to write")
    args = parser.parse_args()
    timed_rounds, slow_rounds = (1, 1) if args.quick else (7, 2)
    use_torch, torch_note = torch_status(args.torch)
    rows = []
    for setup in SETUPS:
        print(setup.tag, setup.description, flush=True)
        x, y = synthetic_data(setup)
        candidates = fljax_candidates(setup, federated(setup, x, y), timed_rounds, slow_rounds)
        if use_torch:
            check_same_size(setup)
            candidates.append(Candidate(f"PyTorch per-client loop ({TORCH_THREADS} threads)",
                                        "torch", torch_round(setup, x, y), timed_rounds))
        rows += measure(setup, candidates)
    body = section(rows, args.quick, timed_rounds, slow_rounds, torch_note)
    print("\n" + body)
    write_report(args.out, body)
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
