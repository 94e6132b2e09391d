"""The runner: the only Python loop, over rounds. Progress bar, evaluation, JSONL log, final table."""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any

import jax
import numpy as np
from tqdm.auto import tqdm

from fljax.config import ExperimentConfig
from fljax.errors import FljaxError
from fljax.experiment import Experiment, build


def prepare_out_dir(out_dir: str) -> None:
    """Create ``out_dir`` and check it is writable, with a clear error if not."""
    try:
        os.makedirs(out_dir, exist_ok=True)
        probe = os.path.join(out_dir, ".write_test")
        with open(probe, "w"):
            pass
        os.remove(probe)
    except OSError as e:
        raise FljaxError(f"output dir {out_dir!r} is not writable ({e.strerror})") from None


def _host(metrics: dict) -> dict[str, Any]:
    return {k: np.asarray(v).tolist() for k, v in jax.device_get(metrics).items()}


def run(config: ExperimentConfig, *, progress: bool = True, experiment: Experiment | None = None
        ) -> list[dict[str, Any]]:
    """Train ``config.rounds`` rounds; return the evaluation records (also in metrics.jsonl).

    Round metrics are read one round late, so the device never waits for the host.
    """
    experiment = experiment or build(config)
    prepare_out_dir(config.out_dir)
    with open(os.path.join(config.out_dir, "config.json"), "w") as f:
        json.dump(config.to_dict(), f, indent=1)
    log_path = os.path.join(config.out_dir, "metrics.jsonl")
    state = experiment.initial_state()
    evaluations: list[dict[str, Any]] = []
    start = time.perf_counter()
    bar = tqdm(total=config.rounds, disable=not progress, unit="round", dynamic_ncols=True)
    last_eval: dict[str, Any] = {}

    with open(log_path, "w") as log:
        def record(round_index: int, metrics: dict) -> None:
            m = _host(metrics)
            if not math.isfinite(m["train_loss"]):
                raise FljaxError(
                    f"round {round_index}: the training loss is {m['train_loss']} with algorithm "
                    f"{experiment.algorithm.name!r}; the local learning rate ({config.lr}) may be "
                    f"too large")
            line = {"kind": "round", "round": round_index, "train_loss": m["train_loss"],
                    "clients": m["clients"], "time_s": time.perf_counter() - start}
            log.write(json.dumps(line) + "\n")
            bar.set_postfix(loss=f"{m['train_loss']:.4f}", **last_eval)
            bar.update(1)

        pending = None
        for t in range(config.rounds):
            state, metrics = experiment.round_fn(state)
            if pending is not None:
                record(*pending)
            pending = (t + 1, metrics)
            if (t + 1) % config.eval_every == 0 or t + 1 == config.rounds:
                record(*pending)
                pending = None
                scores = {k: float(v) for k, v in experiment.evaluate(state.params).items()}
                entry = {"kind": "eval", "round": t + 1, **scores,
                         "time_s": time.perf_counter() - start}
                log.write(json.dumps(entry) + "\n")
                log.flush()
                evaluations.append(entry)
                last_eval = {"acc": f"{scores['accuracy']:.3f}"}
        if pending is not None:
            record(*pending)
    bar.close()
    return evaluations


def results_table(evaluations: list[dict[str, Any]], title: str) -> str:
    """A plain-text table of the evaluations, with the best and final accuracy."""
    lines = [title, f"{'round':>6}  {'test acc':>8}  {'test loss':>9}  {'time (s)':>8}"]
    for e in evaluations:
        lines.append(f"{e['round']:>6}  {e['accuracy']:>8.4f}  {e['loss']:>9.4f}  "
                     f"{e['time_s']:>8.1f}")
    best = max(evaluations, key=lambda e: e["accuracy"])
    lines.append(f"final accuracy {evaluations[-1]['accuracy']:.4f}; best {best['accuracy']:.4f} "
                 f"at round {best['round']}; {evaluations[-1]['time_s']:.1f} s in all")
    return "\n".join(lines)
