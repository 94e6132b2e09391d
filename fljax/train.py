"""The runner: the only Python loop, over rounds.

Progress bar, evaluation every k rounds, run logs, orbax checkpoints every c rounds and at the end,
automatic resume from the latest checkpoint, a divergence guard, and Ctrl-C that saves and exits.
Nothing is lost: a checkpoint is written only for a state whose round was checked finite, and the
checkpoint directory only ever gains complete checkpoints.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import sys
import threading
import time
from typing import Any

import jax
import numpy as np
from tqdm import tqdm

from fljax.accounting import param_bytes, round_bytes
from fljax.checkpoint import Checkpoints
from fljax.config import ExperimentConfig
from fljax.errors import FljaxError
from fljax.experiment import Experiment, build
from fljax.logs import RunLog, SilentLog, read_log
from fljax.multihost import barrier, check_devices, is_primary, start as start_processes
from fljax.personalize import finetune_key
from fljax.placement import to_host


class Diverged(FljaxError):
    """The loss or the global model became NaN or Inf in round ``round`` (nothing bad is saved)."""

    def __init__(self, message: str, round_index: int):
        super().__init__(message)
        self.round = round_index


class RunInterrupted(Exception):
    """Ctrl-C stopped the run after saving a checkpoint of the last finished round."""

    def __init__(self, round_index: int, directory: str):
        super().__init__(
            f"interrupted after round {round_index}; checkpoint saved in {directory!r}; run the "
            f"same command again to resume" if round_index else
            "interrupted before the first round; run the same command again to start")
        self.round = round_index


def writable_dir(path: str, what: str) -> None:
    """Create directory ``path`` if needed and check that files can be created in it (leaving
    nothing behind), with a one-line FljaxError naming ``what`` if not."""
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, f".write_test.{os.getpid()}")
        with open(probe, "w"):
            pass
        os.remove(probe)
    except OSError as e:
        raise FljaxError(f"{what} {path!r} is not writable ({e.strerror})") from None


def write_file(path: str, text: str) -> None:
    """Replace the file ``path`` by ``text`` atomically: a kill leaves the old or the new file,
    never a part of one."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


@contextlib.contextmanager
def _sigint_flag():
    """Turn Ctrl-C into a flag checked between rounds (never mid-round or mid-save)."""
    flag = {"stop": False}
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return

    def handler(signum, frame):
        flag["stop"] = True

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, previous)


ROUND_KEYS = ("train_loss", "clients", "params_finite", "client_steps")


def run(config: ExperimentConfig, *, progress: bool = True, fresh: bool = False,
        experiment: Experiment | None = None) -> list[dict[str, Any]]:
    """Train until round ``config.rounds``, resuming from ``config.out_dir`` unless ``fresh``.

    Returns every evaluation record of the run (also in ``OUT_DIR/metrics.jsonl``). Raises
    FljaxError for bad input or divergence, RunInterrupted after Ctrl-C. Everything is checked
    (config, data, writable directories, the checkpoint to resume from, the log) before the run
    directory is changed, so a run that cannot start leaves it as it was (``fresh`` aside). A
    damaged checkpoint is moved to ``OUT_DIR/damaged_checkpoints`` and the run resumes from the
    newest intact one. From the first write on, Ctrl-C stops the run after the current round.

    With ``config.num_processes`` > 1, every process calls ``run`` with the same config (but its
    own ``process_id``): they train one model over all their devices, and process 0 writes the
    log (``fljax.multihost``).
    """
    config.validate()
    start_processes(config.coordinator_address, config.num_processes, config.process_id)
    check_devices(config.num_devices)
    experiment = experiment or build(config)
    primary = is_primary()
    postfix: dict[str, str] = {}

    def exchanged(rounds: int) -> int:
        """Server<->client exchanges in rounds 0..rounds-1 (FedGA's extra one counted)."""
        return sum(experiment.algorithm.exchanges(t) for t in range(rounds))

    def check_and_log(round_index: int, metrics: dict) -> None:
        m = to_host(metrics)
        loss = float(m["train_loss"])
        if not math.isfinite(loss) or not bool(m["params_finite"]):
            what = f"the training loss is {loss}" if not math.isfinite(loss) else \
                "the global model has NaN or Inf parameters"
            kept = checkpoints.latest_round()
            raise Diverged(
                f"round {round_index}: {what} with algorithm {experiment.algorithm.name!r}; "
                f"stopped. A too large learning rate (lr={config.lr}, server_lr="
                f"{config.server_lr}) or algorithm coefficient is the usual cause. "
                + (f"The last good checkpoint (round {kept}) is kept in "
                   f"{checkpoints.directory!r}" if kept is not None else "No checkpoint was "
                   "written yet"), round_index)
        extras = {k: float(v) for k, v in m.items() if k not in ROUND_KEYS}
        clients = np.asarray(m["clients"])
        cohort = clients[clients >= 0].tolist()
        extras.update(cost.round(round_index, len(cohort), state))
        last_round.clear()
        last_round.update(extras)
        log.round(round_index, loss, cohort, time.perf_counter() - start,
                  {"communication_rounds": exchanged(round_index), **extras})
        postfix["loss"] = f"{loss:.4f}"
        bar.set_postfix(postfix)
        bar.update(1)

    last_round: dict[str, float] = {}
    with _sigint_flag() as interrupt:   # until the run's files are closed
        with contextlib.ExitStack() as closing:
            writable_dir(config.out_dir, "output dir")
            checkpoint_dir = os.path.join(config.out_dir, "checkpoints")
            if fresh and primary and os.path.isdir(checkpoint_dir):
                try:
                    shutil.rmtree(checkpoint_dir)
                except OSError as e:
                    raise FljaxError(f"--fresh cannot delete {checkpoint_dir!r} "
                                     f"({e.strerror})") from None
            barrier("fresh")
            checkpoints = closing.enter_context(contextlib.closing(
                Checkpoints(config.out_dir, keep=config.keep_checkpoints)))
            writable_dir(checkpoints.directory, "checkpoint dir")
            state = experiment.initial_state()
            saved_round, saved_state, damaged = checkpoints.restore_latest(
                state, config.to_dict(), defaults=ExperimentConfig().to_dict())
            if saved_state is not None:
                state = experiment.round_fn.place(saved_state)
            log = closing.enter_context(contextlib.closing(   # reads the log before rewriting it
                (RunLog if primary else SilentLog)(config.out_dir, saved_round)))
            for error in damaged if primary else ():
                moved = checkpoints.set_aside(error.round, os.path.join(config.out_dir,
                                                                        "damaged_checkpoints"))
                print(f"fljax: warning: {error}; moved to {moved!r}; resuming from checkpoint "
                      f"{saved_round}", file=sys.stderr)
            if primary:
                write_file(os.path.join(config.out_dir, "config.json"),
                           json.dumps(config.to_dict(), indent=1))
            done = saved_round or 0
            logged = read_log(log.path)
            previous_time = max([r["time_s"] for r in logged] or [0.0])
            cost = Accounting(experiment, config, logged)
            extra_evals = {r for p in experiment.round_fn.probes for r in p.eval_rounds}
            start = time.perf_counter() - previous_time
            bar = closing.enter_context(contextlib.closing(tqdm(
                total=config.rounds, initial=min(done, config.rounds),
                disable=not (progress and primary),
                unit="round", dynamic_ncols=True)))
            pending = None
            for t in range(done, config.rounds):
                if interrupt["stop"]:
                    break
                state, metrics = experiment.round_fn(state)
                if pending is not None:
                    check_and_log(*pending)   # the previous round, read one round late
                pending = (t + 1, metrics)
                evaluate = ((t + 1) % config.eval_every == 0 or t + 1 == config.rounds
                            or t + 1 in extra_evals)
                save = (t + 1) % config.checkpoint_every == 0 or t + 1 == config.rounds
                if evaluate or save:
                    check_and_log(*pending)
                    pending = None
                if evaluate:
                    scores = {**last_round, **evaluate_models(experiment, state),
                              "communication_rounds": exchanged(t + 1), **cost.totals()}
                    log.evaluation(t + 1, scores, time.perf_counter() - start)
                    postfix["acc"] = f"{scores['accuracy']:.3f}"
                if save:
                    log.commit()   # a checkpoint never covers a record that is not on disk
                    checkpoints.save(t + 1, state, config.to_dict())
            if pending is not None:
                check_and_log(*pending)
            if interrupt["stop"]:
                finished = int(state.round)
                if finished and checkpoints.latest_round() != finished:
                    log.commit()
                    checkpoints.save(finished, state, config.to_dict())
                raise RunInterrupted(finished, checkpoints.directory)
    return [r for r in read_log(log.path) if r["kind"] == "eval"]


def evaluate_models(experiment: Experiment, state) -> dict[str, float]:
    """Scores of the algorithm's evaluation models: 'accuracy', 'loss' for the first (the global
    model), 'NAME/accuracy', 'NAME/loss' for any other (e.g. FedDyn's aggregate before h); with a
    validation split, the global model's 'val_accuracy', 'val_loss'; with personalized evaluation
    on, the per-user scores ('existing_test_acc', ...) of the global model, or of each user's own
    model for an algorithm with personal models; the probes' evaluation scores. A state spread
    over several processes is evaluated from a whole copy on each."""
    if jax.process_count() > 1:
        state = jax.device_put(to_host(state), jax.local_devices()[0])
    models = experiment.algorithm.eval_models(state.params, state.server_state)
    scores = {}
    for i, (name, params) in enumerate(models.items()):
        prefix = "" if i == 0 else f"{name}/"
        scores.update({prefix + k: float(v) for k, v in experiment.evaluate(params).items()})
    if experiment.evaluate_validation is not None:
        scores.update({f"val_{k}": float(v) for k, v in
                       experiment.evaluate_validation(next(iter(models.values()))).items()})
    if experiment.evaluate_users is not None:
        key = finetune_key(state.key, int(state.round))
        if experiment.algorithm.personal_model is None:
            scores.update(experiment.evaluate_users(next(iter(models.values())), key))
        else:       # each user's own model (fljax.personalize)
            scores.update(experiment.evaluate_users(state.params, key, state.server_state,
                                                    state.client_states))
    scores.update(experiment.round_fn.probe_scores(state, experiment.evaluate,
                                                   experiment.config.out_dir))
    return scores


class Accounting:
    """Bytes and FLOPs per round (``fljax.accounting``) and their running totals, which a resumed
    run takes up from the log's round records."""

    def __init__(self, experiment: Experiment, config: ExperimentConfig, logged: list[dict]):
        self._algorithm = experiment.algorithm
        self._round_fn = experiment.round_fn
        self._model_bytes = None
        self._flops = None
        self._slots = config.num_clients if config.participation == "bernoulli" else None
        rounds = [r for r in logged if r.get("kind") == "round"]
        self._bytes = sum(r.get("bytes_down", 0) + r.get("bytes_up", 0) for r in rounds)
        self._total_flops = sum(r.get("flops", 0.0) for r in rounds)

    def round(self, round_index: int, cohort_size: int, state) -> dict[str, float]:
        """The accounting of round ``round_index`` (1-based) with ``cohort_size`` clients."""
        if self._flops is None:
            self._model_bytes = param_bytes(state.params)
            self._flops = self._round_fn.flops(state)
        down, up = round_bytes(self._algorithm.payload(round_index - 1), cohort_size,
                               self._model_bytes)
        flops = self._flops * (cohort_size / self._slots if self._slots else 1.0)
        self._bytes += down + up
        self._total_flops += flops
        return {"bytes_down": down, "bytes_up": up, "flops": flops}

    def totals(self) -> dict[str, float]:
        """Bytes (both ways) and FLOPs of every round so far: 'bytes', 'total_flops'."""
        return {"bytes": self._bytes, "total_flops": self._total_flops}


def results_table(evaluations: list[dict[str, Any]], title: str,
                  target: float | None = None) -> str:
    """A plain-text table of the evaluations (comm: communication rounds so far, FedGA's extra
    exchange included; with personalized evaluation, the mean test accuracy of existing and new
    users after fine-tuning), with the best and final accuracy and, for a ``target`` accuracy,
    the rounds, bytes, FLOPs and seconds it took to reach it."""
    users = [group for group in ("existing", "new")
             if evaluations and f"{group}_test_acc" in evaluations[-1]]
    lines = [title, f"{'round':>6}  {'comm':>6}  {'test acc':>8}  {'test loss':>9}  "
                    + "".join(f"{group:>8}  " for group in users) + f"{'time (s)':>8}"]
    for e in evaluations:
        comm = e.get("communication_rounds", e["round"])
        lines.append(f"{e['round']:>6}  {comm:>6}  {e['accuracy']:>8.4f}  {e['loss']:>9.4f}  "
                     + "".join(f"{e[f'{group}_test_acc']:>8.4f}  " for group in users)
                     + f"{e['time_s']:>8.1f}")
    if evaluations:
        best = max(evaluations, key=lambda e: e["accuracy"])
        lines.append(f"final accuracy {evaluations[-1]['accuracy']:.4f}; best "
                     f"{best['accuracy']:.4f} at round {best['round']}; "
                     f"{evaluations[-1]['time_s']:.1f} s in all")
    if target is not None:
        lines.append(to_target_line(evaluations, target))
    return "\n".join(lines)


def to_target(evaluations: list[dict[str, Any]], target: float) -> dict[str, float] | None:
    """Rounds, bytes, FLOPs and seconds at the first evaluation whose test accuracy reaches
    ``target``; None if none does."""
    hit = next((e for e in evaluations if e["accuracy"] >= target), None)
    if hit is None:
        return None
    return {"rounds": hit["round"], "bytes": hit.get("bytes", float("nan")),
            "flops": hit.get("total_flops", float("nan")), "seconds": hit["time_s"]}


def to_target_line(evaluations: list[dict[str, Any]], target: float) -> str:
    cost = to_target(evaluations, target)
    if cost is None:
        return f"target accuracy {target:.4f} not reached"
    return (f"target accuracy {target:.4f} reached at round {cost['rounds']}: "
            f"{cost['bytes'] / 1e6:.3g} MB sent, {cost['flops']:.3g} FLOPs, "
            f"{cost['seconds']:.1f} s")


