"""Per-round wall time, FLOPs and bytes of every algorithm relative to FedAvg, on round_speed's (a).

    python benchmarks/algorithm_cost.py [--quick] [--no-timing] [--out BENCHMARKS.md]

Setup (a) of round_speed.py: make_model('small_cnn', (28, 28, 1), 10), 10 clients x 1600 synthetic
examples, all 10 per round, 50 local steps at batch 32, local SGD lr 0.05, the backend's default
client strategy and conv. Each algorithm is built as the CLI builds it (``build_algorithm`` with
default hyperparameters); MOON's model carries its projection head and FedEM's is a mixture of 3,
as in the CLI. All rows are timed round-robin in one run (``timing.round_robin``) and reported as
a ratio to FedAvg, with the FLOPs of the compiled round (``RoundFunction.flops``, loop bodies times
their trip counts: matmuls and convolutions, then with elementwise work too, where FedDyn's and
SCAFFOLD's vector terms show), the bytes a round sends (``Algorithm.payload`` x the model's bytes
x the cohort) and the bits its clients send (a compressed uplink's exact encoding,
``fljax.algorithms.compress``), each as a ratio to FedAvg's (FedDecay (Anonymous, 2023) Figure 1's
two costs), and the state the method keeps, in model copies: per client (SCAFFOLD's c_i, FedDyn's
grad L_k, Ditto's personal model; FedInit Table 8's storage column) and on the server.
"""

from __future__ import annotations

import datetime
from typing import NamedTuple

import jax

import fljax
from fljax.runner.config import ALGORITHMS, FULL_BATCH, ExperimentConfig
from fljax.runner.experiment import build_algorithm
from fljax.accounting import client_bits, param_bytes
from fljax.models.heads import with_projection_head
from fljax.models.mixture import mixture
from round_speed import LEARNING_RATE, cost_benchmark, runner
from timing import DISTURBED, machine, round_robin, write_section

TARGET = 1.2   # every algorithm within 1.2x of FedAvg ...
# ... except where the algorithm itself does more model work per local step than FedAvg's one
# forward and backward pass (the work any implementation must do):
EXTRA_WORK = {
    "fedsam": "a second forward and backward pass per step (the SAM ascent)",
    "moon": "two extra forward passes per step (global and previous model) and a projection head",
    "fedntd": "an extra forward pass of the global model per step",
    "scaffold": "option II (default) needs none; option I would add a full-gradient pass",
}
INHERENT = ("fedsam", "moon", "fedntd", "fedga", "gradalign", "ditto", "pfedme", "fedem")
EXTRA_WORK.update({
    "fedga": "a full pass over each client's data for its full gradient (here 50 batches, "
             "as many as its 50 local steps)",
    "gradalign": "as FedGA (GradAlign's own setting is one local step)",
    "ditto": "a second local loop per client: its personal model (as many steps)",
    "pfedme": "K = 5 inner gradient steps per local step, and the personal model's loop",
    "fedem": "M = 3 components: 3 forward and backward passes per step, 3 more forward passes "
             "for the E-step's responsibilities, and a full E-step pass over the data",
})
SWITCH = "feddyn->fedavg"
# Rows beyond the plain algorithms: name -> config values.
EXTRA_ROWS = {
    SWITCH: dict(algorithm="feddyn", switch_to="fedavg", switch_at=10**6),
    "fedavg+fedbug(P=0.5)": dict(wrappers={"gradual_unfreezing": {"fraction": 0.5}}),
    "fedavg+RI(beta=0.1)": dict(wrappers={"relaxed_init": {"beta": 0.1}}),
    "scaffold+RI(beta=0.1)": dict(algorithm="scaffold", wrappers={"relaxed_init": {"beta": 0.1}}),
    **{f"fedavg+{label}": dict(wrappers={"compress": args}) for label, args in {
        "top_k(0.01)+EF": {"compressor": "top_k", "ratio": 0.01, "error_feedback": True},
        "random_k(0.1)+EF": {"compressor": "random_k", "ratio": 0.1, "error_feedback": True},
        "qsgd(4, bucket 512)": {"compressor": "qsgd", "levels": 4, "bucket_size": 512},
        "scaled_sign+EF": {"compressor": "scaled_sign", "error_feedback": True},
        "rotated_uniform(2 bits)": {"compressor": "rotated_uniform", "bits": 2}}.items()},
    "scaffold+top_k(0.01)+EF": dict(algorithm="scaffold", wrappers={"compress": {
        "compressor": "top_k", "ratio": 0.01, "error_feedback": True}}),
}
REQUIRED_ARGS = {"feddecay": {"beta": 0.9}}


class Cost(NamedTuple):
    flops: float            # matmuls and convolutions of one compiled round
    all_flops: float        # ... and elementwise work
    sent: int               # bytes one round sends both ways
    up_bits: int            # bits one round's clients send (compressed: the exact encoding)
    client_models: float    # state per client, in model copies
    server_models: float    # server state, in model copies


def candidate(name: str, setup, data) -> tuple[callable, Cost]:
    """(a closure running one round of ``name`` (an algorithm or a row of EXTRA_ROWS), its
    Cost)."""
    model = setup.build(fljax.models.DEFAULT_CONV_IMPL)
    if name == "moon":
        model = with_projection_head(model)
    if name == "fedem":
        model = mixture(model, 3)
    values = EXTRA_ROWS.get(name, dict(algorithm=name,
                                       algorithm_args=REQUIRED_ARGS.get(name, {})))
    config = ExperimentConfig(lr=LEARNING_RATE).replace(**values)
    algorithm = build_algorithm(config, model)
    round_fn = fljax.make_round(algorithm, model, data, clients_per_round=setup.cohort,
                                batch_size=setup.batch, local_steps=setup.local_steps)
    state = fljax.init_state(algorithm, model.init(jax.random.key(0)), data.num_clients, seed=0)
    model_bytes = param_bytes(state.params)
    down, up = client_bits(algorithm, 0, state.params)
    cost = Cost(round_fn.flops(state), round_fn.flops(state, elementwise=True),
                setup.cohort * (down + up) / 8, setup.cohort * up,
                param_bytes(state.client_states) / data.num_clients / model_bytes,
                param_bytes(state.server_state) / model_bytes)
    return runner(round_fn, state), cost


def counted(names, costs: list[Cost]) -> str:
    """The table of what is counted, not timed: FLOPs (with elementwise work to 3 decimals, where
    FedDyn's and SCAFFOLD's vector terms show), bytes and state."""
    ref = costs[names.index("fedavg")]
    lines = [f"Date: {datetime.date.today().isoformat()}. Counted from the compiled programs "
             "(deterministic: no timing).", "",
             "| algorithm | FLOPs / FedAvg | with elementwise / FedAvg | bytes / FedAvg | uplink "
             "bits / FedAvg | state per client (models) | server state (models) |",
             "|---|---|---|---|---|---|---|"]
    for name, c in zip(names, costs):
        lines.append(f"| {name} | {c.flops / ref.flops:.3f}x | {c.all_flops / ref.all_flops:.3f}x "
                     f"| {c.sent / ref.sent:.2f}x | {c.up_bits / ref.up_bits:.4f}x | "
                     f"{c.client_models:.2f} | {c.server_models:.2f} |")
    return "\n".join(lines)


def report(names, timings, rounds: int, costs: list[Cost]) -> str:
    base = timings[names.index("fedavg")].seconds
    ref = costs[names.index("fedavg")]
    lines = [f"Machine: {machine()}. Date: {datetime.date.today().isoformat()}. Median of {rounds} "
             "timed rounds per row after one warm-up round, rows timed round-robin in one run.",
             "", "| algorithm | s/round | ratio to FedAvg | within 1.2x | FLOPs / FedAvg | "
             "with elementwise / FedAvg | bytes / FedAvg | uplink bits / FedAvg | state per client "
             "(models) | server state (models) | note |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, t, c in zip(names, timings, costs):
        ratio = t.seconds / base
        ok = "yes" if ratio <= TARGET else ("no (inherent)" if name in INHERENT else "**no**")
        note = EXTRA_WORK.get(name, "")
        if name == SWITCH:
            note = "switch(feddyn, fedavg) before the switch: its lax.cond next to plain FedDyn"
        if "+" in name:
            note = "a wrapper over the algorithm before the +"
        if t.disturbed:
            note += f" ({t.disturbed} disturbed rounds dropped)"
        lines.append(f"| {name} | {t.seconds:.3f} | {ratio:.2f}x | {ok} | "
                     f"{c.flops / ref.flops:.2f}x | {c.all_flops / ref.all_flops:.2f}x | "
                     f"{c.sent / ref.sent:.2f}x | {c.up_bits / ref.up_bits:.4f}x | "
                     f"{c.client_models:.2f} | {c.server_models:.2f} | {note} |")
    if not any(t.disturbed for t in timings):
        lines += ["", f"No timed round was disturbed (other processes took <= {DISTURBED} of a "
                  "core during every timed round)."]
    return "\n".join(lines)


def main() -> None:
    args, rounds, setup, data = cost_benchmark(__doc__.splitlines()[0], "algorithm",
                                               untimed=True)
    # FedSGD and large-batch SGD take one full-batch step: not the same local work.
    names = [n for n in ALGORITHMS if n not in FULL_BATCH] + list(EXTRA_ROWS)
    runs, costs = [], []
    for name in names:
        print("building", name, flush=True)
        run, cost = candidate(name, setup, data)
        runs.append(run)
        costs.append(cost)
    backend = "GPU" if jax.default_backend() == "gpu" else "CPU"
    if args.no_timing:
        body = counted(names, costs)
        print("\n" + body)
        setup_text = __doc__.split("\n\n", 2)[2].split(" All rows are timed")[0]
        write_section(args.out, "Algorithm cost, counted (`benchmarks/algorithm_cost.py "
                      "--no-timing`)", setup_text.strip() + "\n\n" + body)
        print(f"\nwritten to {args.out}")
        return
    timings = round_robin(runs, [rounds] * len(runs))
    body = report(names, timings, rounds, costs)
    print("\n" + body)
    write_section(args.out, f"Algorithm cost, {backend} (`benchmarks/algorithm_cost.py`)",
                  __doc__.split("\n\n", 2)[2].strip() + "\n\n" + body)
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
