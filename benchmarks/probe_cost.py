"""What each probe costs: round time with the probe over the bare round, side by side in one run.

    python benchmarks/probe_cost.py [--quick] [--out BENCHMARKS.md]

Setup (a) of round_speed.py (make_model('small_cnn', (28, 28, 1), 10), 10 clients x 1600 synthetic
examples, all 10 per round, 50 local steps at batch 32) with FedDyn (alpha 0.01, adaptive), so that
every probe applies. Rows: the bare round (no probe), ``probes=[]`` (must be the same program),
each in-round probe alone, and all of them; all timed round-robin (``timing.round_robin``) and
reported as a ratio to the bare round. The evaluation-time probes run on the host at evaluations,
not in the round: their rows give the seconds of one evaluation call next to the plain test-set
evaluation (10,000 synthetic test images).
"""

from __future__ import annotations

import datetime
import time

import jax
import numpy as np

import fljax
from fljax import probes
from round_speed import LEARNING_RATE, NUM_CLASSES, cost_benchmark, runner
from timing import DISTURBED, machine, round_robin, write_section

WHAT = {
    "pseudo_gradient_diversity": "one model-sized sum over the cohort",
    "cosine_previous": "a stored pseudo-gradient per client (N x params), one cosine each",
    "state_diversity": "a pass over the N stored drifts",
    "gradient_dissimilarity": "two full-gradient passes over every client's data",
    "switching_criterion": "one full-gradient pass over every client's data at theta*",
    "all_model": "a stored local model per client (N x params)",
    "interaction_tensor": "a stored local model per client; analysis only at its rounds",
}


def in_round_probes(params) -> dict[str, list]:
    rows = {"pseudo_gradient_diversity": [probes.pseudo_gradient_diversity()],
            "cosine_previous": [probes.cosine_previous()],
            "state_diversity": [probes.state_diversity()],
            "gradient_dissimilarity": [probes.gradient_dissimilarity()],
            "switching_criterion": [probes.switching_criterion(alpha=0.01, smoothness=1.0,
                                                               zeta=1.0, optimum=params)],
            "all_model": [probes.all_model()]}
    rows["all of the above"] = [p for ps in list(rows.values()) for p in ps]
    return rows


def main() -> None:
    args, rounds, setup, data = cost_benchmark(__doc__.splitlines()[0], "row")
    model = setup.build(fljax.models.DEFAULT_CONV_IMPL)
    algorithm = fljax.feddyn(fljax.local_sgd(LEARNING_RATE))
    params = model.init(jax.random.key(0))

    def round_of(probe_list):
        round_fn = fljax.make_round(algorithm, model, data, clients_per_round=setup.cohort,
                                    batch_size=setup.batch, local_steps=setup.local_steps,
                                    probes=probe_list)
        return runner(round_fn, round_fn.init_state(params, seed=0))

    rows = {"bare round (no probes argument)": None, "probes=[]": [],
            **in_round_probes(params)}
    runs = [round_of(() if p is None else p) for p in rows.values()]
    timings = round_robin(runs, [rounds] * len(runs))
    base = timings[0].seconds
    lines = [f"Machine: {machine()}. Date: {datetime.date.today().isoformat()}. Median of "
             f"{rounds} timed rounds per row after one warm-up round, rows timed round-robin in "
             "one run.", "", "| probe | s/round | ratio to the bare round | what it adds |",
             "|---|---|---|---|"]
    for name, t in zip(rows, timings):
        note = WHAT.get(name, "")
        if t.disturbed:
            note += f" ({t.disturbed} disturbed rounds dropped)"
        lines.append(f"| {name} | {t.seconds:.3f} | {t.seconds / base:.2f}x | {note} |")
    if not any(t.disturbed for t in timings):
        lines += ["", f"No timed round was disturbed (other processes took <= {DISTURBED} of a "
                  "core during every timed round)."]
    lines += ["", "The probes=[] row compiles to the same program as the bare round (tests/"
              "test_probes.py compares the lowered programs' fingerprints): its ratio is the "
              "timing spread of the machine.", "",
              *evaluation_rows(model, data, algorithm, params, setup)]
    body = "\n".join(lines)
    print("\n" + body)
    backend = "GPU" if jax.default_backend() == "gpu" else "CPU"
    write_section(args.out, f"Probe cost, {backend} (`benchmarks/probe_cost.py`)",
                  __doc__.split("\n\n", 2)[2].strip() + "\n\n" + body)
    print(f"\nwritten to {args.out}")


def evaluation_rows(model, data, algorithm, params, setup) -> list[str]:
    """Seconds of one evaluation: the plain test evaluation and each evaluation-time probe."""
    rng = np.random.default_rng(1)
    x_test = rng.normal(size=(10_000, *setup.image)).astype(np.float32)
    y_test = rng.integers(0, NUM_CLASSES, 10_000)
    evaluate = fljax.make_evaluator(model, x_test, y_test)
    timed = {"test-set evaluation (no probe)": None,
             "train_evaluation": probes.train_evaluation(),
             "all_model": probes.all_model(),
             "interaction_tensor (one analysis, 1000 points, K=20)":
                 probes.interaction_tensor(x_test[:1000], rounds=[1])}
    lines = ["| evaluation | s per evaluation | ratio to the test-set evaluation | what it does |",
             "|---|---|---|---|"]
    base = None
    for name, probe in timed.items():
        round_fn = fljax.make_round(algorithm, model, data, clients_per_round=setup.cohort,
                                    batch_size=setup.batch, local_steps=setup.local_steps,
                                    probes=[] if probe is None else [probe])
        state, _ = round_fn(round_fn.init_state(params, seed=0))
        score = (lambda: evaluate(state.params)) if probe is None else \
            (lambda: round_fn.probe_scores(state, evaluate))
        jax.block_until_ready(score())                    # compile
        start = time.perf_counter()
        jax.block_until_ready(score())
        seconds = time.perf_counter() - start
        base = base or seconds
        what = {"train_evaluation": "the global model over the 16,000 training examples",
                "all_model": "the mean of the N latest local models on the test set"}.get(
            name, "features of |P_t| + 2 = 12 models, PCA, clustering, Omega" if probe else
            "the global model on the test set")
        lines.append(f"| {name} | {seconds:.3f} | {seconds / base:.2f}x | {what} |")
    return lines


if __name__ == "__main__":
    main()
