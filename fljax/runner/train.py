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
from typing import Any, Callable

import jax
import numpy as np
from tqdm import tqdm

from fljax import registry
from fljax.accounting import client_bits
from fljax.runner.checkpoint import CalibratedRoundsChanged, Checkpoints, check_same_experiment
from fljax.runner.config import ExperimentConfig
from fljax.errors import FljaxError, writing
from fljax.runner.experiment import Batch, Experiment, batch_memory, batch_of, build
from fljax.runner.logs import RunLog, SilentLog, read_log
from fljax.runner.multihost import (agree_to_stop, barrier, check_devices, failed, finished,
                             is_primary, on_stopped, start as start_processes)
from fljax.core.personalize import finetune_key
from fljax.core.placement import to_host
from fljax.core.runs import stack, take


class Diverged(FljaxError):
    """The loss or the global model became NaN or Inf in round ``round`` (nothing bad is saved)."""

    def __init__(self, message: str, round_index: int):
        super().__init__(message)
        self.round = round_index


class RoundsHeld(FljaxError):
    """Run directories that already hold more rounds than asked: ``runs``, a list of
    ``(directory, rounds held, rounds asked)``. Nothing was trained, nothing changed."""

    def __init__(self, runs: list[tuple[str, int, int]]):
        directory, held, asked = runs[0]
        most = max(h for _, h, _ in runs)
        if len(runs) == 1:
            message = (f"{directory} already holds {held} rounds (asked: {asked}); nothing was "
                       f"trained. Use --rounds {held} to see its results, --out-dir NEW for a "
                       f"new run, or --fresh to delete this directory's checkpoints and logs "
                       f"and start over")
        else:
            message = (f"{len(runs)} run directories already hold more rounds than asked "
                       f"({directory} holds {held}, asked: {asked}); nothing was trained. Use "
                       f"--rounds {most} to see their results, --out-dir NEW for new runs, or "
                       f"--fresh to delete their checkpoints and logs and start over")
        super().__init__(message)
        self.runs = runs


def newest_round(run_dir: str) -> int:
    """The round of the newest checkpoint directory in ``run_dir`` (0 without one), from the
    directory's listing alone (nothing is read or opened: JAX may not have started)."""
    directory = os.path.join(run_dir, "checkpoints")
    names = os.listdir(directory) if os.path.isdir(directory) else []
    return max((int(name) for name in names if name.isdigit()), default=0)


def rounds_held(config: ExperimentConfig, refuse_new_rounds: bool = False) -> int:
    """The round of the newest checkpoint in ``config``'s run directory, read without changing
    anything there; 0 without one, and for one that is damaged or another experiment's (the run
    then says what is wrong). ``refuse_new_rounds``: raise CalibratedRoundsChanged for a
    --target-epsilon checkpoint planned for other rounds (before the noise is calibrated)."""
    newest = newest_round(config.run_dir())
    if not newest:
        return 0
    try:
        checkpoints = Checkpoints(config.run_dir(), read_only=True)
        try:
            check_same_experiment(checkpoints.saved_config(newest), config.resolved().to_dict(),
                                  checkpoints.directory, ExperimentConfig().to_dict())
        finally:
            checkpoints.close()
    except CalibratedRoundsChanged:
        if refuse_new_rounds:
            raise
        return 0
    except FljaxError:
        return 0
    return newest


def check_rounds(configs: list[ExperimentConfig], refuse_new_rounds: bool = False) -> None:
    """RoundsHeld naming the runs of ``configs`` whose directory holds a checkpoint past their
    ``rounds`` (before anything is built, trained or written); ``refuse_new_rounds`` as in
    ``rounds_held``."""
    held = [(c.run_dir(), rounds_held(c, refuse_new_rounds), c.rounds) for c in configs]
    past = [run for run in held if run[1] > run[2]]
    if past:
        raise RoundsHeld(past)


# What --fresh deletes in a run directory: the files a run writes there.
RUN_FILES = ("checkpoints", "damaged_checkpoints", "tb", "metrics.jsonl", "config.json")


def delete_run_files(directory: str) -> None:
    """``--fresh``: delete the run's checkpoints and logs (RUN_FILES) in ``directory``; nothing
    else there is touched."""
    for name in RUN_FILES:
        path = os.path.join(directory, name)
        try:
            if os.path.isdir(path):
                shutil.rmtree(path)
            elif os.path.exists(path):
                os.remove(path)
        except OSError as e:
            raise FljaxError(f"--fresh cannot delete {path!r} ({e.strerror})") from None


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
    with writing(repr(path)):
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


class RunRecord:
    """One run's files and bookkeeping as a loop over rounds drives it: its checkpoints (restored
    from, saved to), its log, the accounting of bytes and FLOPs, the divergence guard and its
    evaluations. ``share``: the run's share of the program's time (1/R for one of R runs trained
    together), so that ``time_s`` adds up to the wall time over a table's runs.

    Everything is checked (writable directories, the checkpoint to resume from, the log) before
    the run directory is changed, so a run that cannot start leaves it as it was (``fresh``
    aside)."""

    def __init__(self, config: ExperimentConfig, experiment: Experiment,
                 closing: contextlib.ExitStack, *, fresh: bool, primary: bool,
                 flops: Callable[[Any], float], share: float = 1.0):
        self.config = config
        self.experiment = experiment
        self.directory = config.run_dir()
        self._closing, self._primary, self._flops, self._share = closing, primary, flops, share
        writable_dir(self.directory, "output dir")
        if fresh and primary:
            delete_run_files(self.directory)
        barrier("fresh")
        self.checkpoints = closing.enter_context(contextlib.closing(
            Checkpoints(self.directory, keep=config.keep_checkpoints)))
        writable_dir(self.checkpoints.directory, "checkpoint dir")
        self.last_round: dict[str, float] = {}
        self.postfix: dict[str, str] = {}

    def resume(self, initial) -> tuple[int, Any]:
        """``restore`` then ``open``: (rounds done, state to continue from)."""
        done, state = self.restore(initial)
        self.open()
        return done, state

    def restore(self, initial) -> tuple[int, Any]:
        """(rounds done, state to continue from: the newest intact checkpoint's, or ``initial``),
        changing nothing in the run directory. RoundsHeld if that checkpoint is past
        ``config.rounds``; a finished run (a checkpoint at ``config.rounds``) says in one line
        that nothing will be trained."""
        config = self.config
        saved_round, saved_state, self._damaged = self.checkpoints.restore_latest(
            initial, config.to_dict(), defaults=ExperimentConfig().to_dict(),
            derived=("hparams",))      # whichever runs shared the program that saved it
        self.done, self.finished = saved_round or 0, saved_round == config.rounds
        if self.done > config.rounds:
            raise RoundsHeld([(self.directory, self.done, config.rounds)])
        if self.finished and self._primary:
            print(f"fljax: {self.directory} holds a finished run of {self.done} rounds; nothing "
                  f"was trained: its results are the stored ones", flush=True)
        self._initial_params = jax.eval_shape(lambda: initial.params)
        return self.done, (initial if saved_state is None else saved_state)

    def open(self) -> None:
        """Open the log (its records after the restored checkpoint are dropped), write
        config.json and set damaged newer checkpoints aside with a warning; a finished run's log
        and config.json are left as they are."""
        config, checkpoints = self.config, self.checkpoints
        if self.finished:
            self.log = SilentLog(self.directory, self.done)
        else:
            self.log = self._closing.enter_context(contextlib.closing(  # reads, rewrites it
                (RunLog if self._primary else SilentLog)(self.directory, self.done or None)))
        for error in self._damaged if self._primary else ():
            moved = checkpoints.set_aside(error.round, os.path.join(self.directory,
                                                                    "damaged_checkpoints"))
            print(f"fljax: warning: {error}; moved to {moved!r}; resuming from checkpoint "
                  f"{self.done}", file=sys.stderr)
        if self._primary and not self.finished:
            write_file(os.path.join(self.directory, "config.json"),
                       json.dumps(config.record(), indent=1))
        logged = read_log(self.log.path)
        self.time_s = max([r["time_s"] for r in logged] or [0.0])
        self.cost = Accounting(self.experiment, config, logged, self._flops,
                               self._initial_params)

    def exchanged(self, rounds: int) -> int:
        """Server<->client exchanges in rounds 0..rounds-1 (FedGA's extra one counted)."""
        return sum(self.experiment.algorithm.exchanges(t) for t in range(rounds))

    def due(self, round_index: int) -> tuple[bool, bool]:
        """(evaluate, save) after round ``round_index``."""
        config = self.config
        extra = {r for p in self.experiment.round_fn.probes for r in p.eval_rounds}
        return (round_index % config.eval_every == 0 or round_index == config.rounds
                or round_index in extra,
                round_index % config.checkpoint_every == 0 or round_index == config.rounds)

    def record(self, round_index: int, metrics: dict, state, seconds: float) -> None:
        """Log round ``round_index``'s metrics (host values) after ``seconds`` of the program's
        wall time; Diverged if the loss or the model is not finite."""
        config, m = self.config, metrics
        self.time_s += self._share * seconds
        loss = float(m["train_loss"])
        if not math.isfinite(loss) or not bool(m["params_finite"]):
            what = f"the training loss is {loss}" if not math.isfinite(loss) else \
                "the global model has NaN or Inf parameters"
            kept = self.checkpoints.latest_round()
            raise Diverged(
                f"round {round_index}: {what} with algorithm "
                f"{self.experiment.algorithm.name!r}; stopped. A too large learning rate "
                f"(lr={config.lr}, server_lr={config.server_lr}) or algorithm coefficient is the "
                f"usual cause. " + (f"The last good checkpoint (round {kept}) is kept in "
                                    f"{self.checkpoints.directory!r}" if kept is not None else
                                    "No checkpoint was written yet"), round_index)
        extras = {k: float(v) for k, v in m.items() if k not in ROUND_KEYS}
        clients = np.asarray(m["clients"])
        cohort = clients[clients >= 0].tolist()
        extras.update(self.cost.round(round_index, len(cohort), state,
                                      int(m["sampled"]) if "sampled" in m else None))
        self.last_round = extras
        self.log.round(round_index, loss, cohort, self.time_s,
                       {"communication_rounds": self.exchanged(round_index), **extras})
        self.postfix["loss"] = f"{loss:.4f}"

    def evaluate(self, round_index: int, state) -> None:
        """Evaluate this run's (unbatched) ``state`` after round ``round_index`` and log it."""
        scores = {**self.last_round, **evaluate_models(self.experiment, state),
                  "communication_rounds": self.exchanged(round_index), **self.cost.totals(),
                  **self.config.privacy_spent(round_index)}
        self.log.evaluation(round_index, scores, self.time_s)
        self.postfix["acc"] = f"{scores['accuracy']:.3f}"

    def save(self, round_index: int, state) -> None:
        """A checkpoint of this run's ``state``, after everything logged is on disk (a checkpoint
        never covers a record a crash could still lose)."""
        self.log.commit()
        self.checkpoints.save(round_index, state, self.config.record())

    def evaluations(self) -> list[dict[str, Any]]:
        """The run's evaluation records (a finished run's: those its last checkpoint covers)."""
        return [r for r in read_log(self.log.path)
                if r["kind"] == "eval" and r["round"] <= self.config.rounds]


def run(config: ExperimentConfig, *, progress: bool = True, fresh: bool = False,
        experiment: Experiment | None = None) -> list[dict[str, Any]]:
    """Train until round ``config.rounds``, resuming from ``config.run_dir()`` unless ``fresh``
    (which first deletes the checkpoints and logs there, ``delete_run_files``).

    Returns every evaluation record of the run (also in ``OUT_DIR/metrics.jsonl``). Raises
    FljaxError for bad input or divergence, RunInterrupted after Ctrl-C. Everything is checked
    (config, data, writable directories, the checkpoint to resume from, the log) before the run
    directory is changed, so a run that cannot start leaves it as it was (``fresh`` aside). A
    damaged checkpoint is moved to ``OUT_DIR/damaged_checkpoints`` and the run resumes from the
    newest intact one. From the first write on, Ctrl-C stops the run after the current round.
    A directory that holds more rounds than ``config.rounds`` is refused (RoundsHeld) and left as
    it is; one that holds exactly as many is a finished run: nothing is trained or written, and
    its stored evaluations are returned.

    With ``config.num_processes`` > 1, every process calls ``run`` with the same config (but its
    own ``process_id``): they train one model over all their devices, and process 0 writes the
    log (``fljax.runner.multihost``).
    """
    import_recorded(config.run_dir())
    config.validate()
    start_processes(config.coordinator_address, config.num_processes, config.process_id)
    try:
        return _run(config, progress, fresh, experiment)
    except RunInterrupted:
        raise
    except Exception as e:    # the other processes of a multi-process run stop, told why
        failed(e)
        raise


def _run(config: ExperimentConfig, progress: bool, fresh: bool,
         experiment: Experiment | None) -> list[dict[str, Any]]:
    check_devices(config.num_devices)
    if not fresh:
        check_rounds([config], refuse_new_rounds=True)  # at once, before the data is read and
                                                        # the DP noise calibrated
    experiment = experiment or build(config)
    config = config.resolved()              # what the algorithm leaves unset, filled in
    primary = is_primary()
    with _sigint_flag() as interrupt:   # until the run's files are closed
        with contextlib.ExitStack() as closing:
            run = RunRecord(config, experiment, closing, fresh=fresh, primary=primary,
                            flops=experiment.round_fn.flops)
            done, state = run.resume(experiment.initial_state())
            state = experiment.round_fn.place(state)
            # delay: an error while the first round compiles is its one line, with no bar
            bar = closing.enter_context(contextlib.closing(tqdm(
                total=config.rounds, initial=min(done, config.rounds),
                disable=not (progress and primary), unit="round", dynamic_ncols=True,
                delay=0.1)))
            clock = time.perf_counter()

            def record(round_index, metrics):
                nonlocal clock
                now = time.perf_counter()
                run.record(round_index, to_host(metrics), state, now - clock)
                clock = now
                bar.set_postfix(run.postfix)
                bar.update(1)

            on_stopped(lambda: newest_checkpoint(run.checkpoints.directory))
            pending, stop = None, False
            for t in range(done, config.rounds):
                stop = agree_to_stop(interrupt["stop"])   # every process stops after one round
                if stop:
                    break
                state, metrics = experiment.round_fn(state)
                if pending is not None:
                    record(*pending)      # the previous round, read one round late
                pending = (t + 1, metrics)
                evaluate, save = run.due(t + 1)
                if evaluate or save:
                    record(*pending)
                    pending = None
                if evaluate:
                    run.evaluate(t + 1, state)
                if save:
                    run.save(t + 1, state)
            if pending is not None:
                record(*pending)
            if stop or agree_to_stop(interrupt["stop"]):
                round_done = int(state.round)
                if round_done and run.checkpoints.latest_round() != round_done:
                    run.save(round_done, state)
                finished()
                raise RunInterrupted(round_done, run.checkpoints.directory)
    finished()
    return run.evaluations()


def import_recorded(out_dir: str, depth: int = 0) -> None:
    """Import again the registered names (a user's algorithm, model, dataset, probes) that the
    run in ``out_dir`` recorded in its config.json (``ExperimentConfig.record``), and the runs
    up to ``depth`` folders below it (a grid's points and seeds: 2; a sweep's: 4), so that a
    resume in a new process finds them (nothing where there is no such file)."""
    try:
        with open(os.path.join(out_dir, "config.json")) as f:
            saved = json.load(f)
        if isinstance(saved, dict):
            registry.import_recorded(saved.get("imports", {}))
    except (OSError, ValueError):
        pass
    if depth > 0 and os.path.isdir(out_dir):
        for entry in sorted(os.scandir(out_dir), key=lambda e: e.name):
            if entry.is_dir() and entry.name not in ("checkpoints", "xla_cache"):
                import_recorded(entry.path, depth - 1)


def newest_checkpoint(directory: str) -> str:
    """Where a stopped multi-process run resumes from (read from the directory alone: it is
    asked from the watchdog's thread while the main one may be writing)."""
    rounds = [int(n) for n in os.listdir(directory) if n.isdigit()] if os.path.isdir(
        directory) else []
    where = f"checkpoint {max(rounds)} in {directory!r} is whole" if rounds else \
        "no checkpoint was written yet"
    return f"{where}: run the same commands again to resume"


def run_batch(batch: Batch, *, progress: bool = True,
              fresh: bool = False) -> list[list[dict[str, Any]] | Diverged]:
    """Train every run of ``batch`` (``fljax.runner.experiment.build_batch``) to its own
    ``config.rounds`` in ONE compiled program, each resuming from its own ``out_dir``.

    Each run writes what ``run`` writes (metrics.jsonl, config.json, checkpoints, TensorBoard),
    evaluated and checkpointed on its own schedule; the runs advance together and a run that
    finished or diverged waits, unchanged, for the others. Returns each run's evaluation
    records, or its Diverged error. Ctrl-C stops every run after the current round with a
    checkpoint (RunInterrupted). Runs whose directories hold more rounds than they ask: one
    RoundsHeld naming them, before any run directory is written to."""
    experiments, round_fn = batch.experiments, batch.round_fn
    size = len(experiments)
    flops = {}

    def flops_per_run(state) -> float:          # the program's, shared by its runs
        if "value" not in flops:
            flops["value"] = round_fn.flops(state) / (size + batch.padding)
        return flops["value"]

    with _sigint_flag() as interrupt:
        with contextlib.ExitStack() as closing:
            runs = [RunRecord(e.config, e, closing, fresh=fresh, primary=True, share=1.0 / size,
                              flops=lambda _: flops["value"]) for e in experiments]
            initial = batch.initial_state()
            resumed, held = [], []
            for r, run in enumerate(runs):      # every run checked before any is written to
                try:
                    resumed.append(run.restore(take(initial, r)))
                except RoundsHeld as e:
                    held += e.runs
            if held:
                raise RoundsHeld(held)
            for run in runs:
                run.open()
            padding = [take(initial, size + p) for p in range(batch.padding)]
            state = round_fn.place(stack([s for _, s in resumed] + padding))
            del initial, padding
            flops_per_run(state)
            done = np.array([d for d, _ in resumed] + [0] * batch.padding)
            rounds = np.array([e.config.rounds for e in experiments] + [0] * batch.padding)
            diverged: dict[int, Diverged] = {}
            bar = closing.enter_context(contextlib.closing(tqdm(
                total=int(rounds.sum()), initial=int(np.minimum(done, rounds).sum()),
                disable=not progress, unit="run-round", dynamic_ncols=True, delay=0.1)))
            clock = time.perf_counter()

            def record(active, after, metrics):
                nonlocal clock
                now = time.perf_counter()
                host = jax.device_get(metrics)
                for r in np.flatnonzero(active):
                    if r in diverged:
                        continue
                    try:
                        runs[r].record(int(after[r]), take(host, r), state, now - clock)
                    except Diverged as e:
                        diverged[r] = e
                clock = now
                bar.set_postfix(runs=int(active.sum()), diverged=len(diverged))
                bar.update(int(active.sum()))

            pending = None
            while not interrupt["stop"]:
                active = (done < rounds) & ~np.isin(np.arange(len(done)), list(diverged))
                if not active.any():
                    break
                state, metrics = round_fn(state, active)
                if pending is not None:
                    record(*pending)
                done = done + active
                pending = (active, done.copy(), metrics)
                due = {r: runs[r].due(int(done[r])) for r in np.flatnonzero(active)}
                if any(e or s for e, s in due.values()):
                    record(*pending)
                    pending = None
                for r, (evaluate, save) in due.items():
                    if r in diverged or not (evaluate or save):
                        continue
                    own = take(state, r)
                    if evaluate:
                        runs[r].evaluate(int(done[r]), own)
                    if save:
                        runs[r].save(int(done[r]), own)
            if pending is not None:
                record(*pending)
            if interrupt["stop"]:
                for r, run in enumerate(runs):
                    if r not in diverged and done[r] and run.checkpoints.latest_round() != done[r]:
                        run.save(int(done[r]), take(state, r))
                raise RunInterrupted(int(done[:size].min()), os.path.commonpath(
                    [run.checkpoints.directory for run in runs]))
    return [diverged.get(r) or run.evaluations() for r, run in enumerate(runs)]


def run_many(configs: list[ExperimentConfig], *, progress: bool = True, fresh: bool = False,
             memory_limit: int | None = None,
             say: Callable[[str], None] = print) -> list[list[dict[str, Any]] | Diverged]:
    """Train ``configs`` that share one program (``fljax.runner.grouping.group``): one config alone
    (``run``), more in programs of as many runs as the memory estimate allows within
    ``memory_limit`` bytes (default ``default_memory_limit``), spread over this process's
    devices. Returns each run's evaluation records, or its Diverged error. RoundsHeld, before
    anything is trained, if a run's directory holds more rounds than it asks (unless ``fresh``)."""
    for config in configs:
        import_recorded(config.run_dir())
    if not fresh:
        check_rounds(configs)
    if len(configs) == 1:
        try:
            return [run(configs[0], progress=progress, fresh=fresh)]
        except Diverged as e:
            return [e]
    shared: dict = {}
    experiments = [build(config, shared=shared) for config in configs]
    devices = jax.local_device_count()
    run_chunk = 1 if jax.default_backend() == "cpu" else None
    per_run, fixed = batch_memory(experiments[0], len(configs),
                                  run_chunk or -(-len(configs) // devices))
    limit = memory_limit or default_memory_limit()
    most = max(1, (limit - fixed) // per_run)
    results = []
    for start in range(0, len(experiments), most):
        chunk = experiments[start:start + most]
        spread = min(devices, len(chunk))
        batch = batch_of(chunk, spread, run_chunk)
        say(f"    {len(chunk)} runs in one program on {spread} device(s): about "
            f"{(fixed + len(chunk) * per_run) / 2**20:.0f} MB estimated "
            f"({per_run / 2**20:.1f} MB a run); limit {limit / 2**20:.0f} MB (--batch-memory)")
        results += run_batch(batch, progress=progress, fresh=fresh)
    return results


def default_memory_limit() -> int:
    """Bytes a batch of runs may take: 3/4 of the accelerators' memory, or half of the host's
    on CPU."""
    device = jax.local_devices()[0]
    if device.platform != "cpu":
        stats = device.memory_stats() or {}
        if "bytes_limit" in stats:
            return int(0.75 * stats["bytes_limit"] * jax.local_device_count())
    return int(0.5 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


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
        else:       # each user's own model (fljax.core.personalize)
            scores.update(experiment.evaluate_users(state.params, key, state.server_state,
                                                    state.client_states))
    scores.update(experiment.round_fn.probe_scores(state, experiment.evaluate,
                                                   experiment.config.run_dir()))
    return scores


class Accounting:
    """Bits, bytes and FLOPs per round (``fljax.accounting``) and their running totals, which a
    resumed run takes up from the log's round records. ``flops(state)``: one round's FLOPs (asked
    once); ``params``: the run's model (shapes suffice)."""

    def __init__(self, experiment: Experiment, config: ExperimentConfig, logged: list[dict],
                 flops: Callable[[Any], float], params):
        self._algorithm = experiment.algorithm
        self._flops_of, self._flops = flops, None
        self._params = params
        self._slots = config.num_clients if config.participation == "bernoulli" else None
        rounds = [r for r in logged if r.get("kind") == "round"]
        self._down = sum(r.get("bits_down", 8 * r.get("bytes_down", 0)) for r in rounds)
        self._up = sum(r.get("bits_up", 8 * r.get("bytes_up", 0)) for r in rounds)
        self._total_flops = sum(r.get("flops", 0.0) for r in rounds)

    def round(self, round_index: int, cohort_size: int, state,
              receivers: int | None = None) -> dict[str, float]:
        """The accounting of round ``round_index`` (1-based) with ``cohort_size`` clients that
        reported, of ``receivers`` that were sent the model (default: the same; more when a
        deadline, dropout or over-selection left some out)."""
        if self._flops is None:
            self._flops = self._flops_of(state)
        down, up = client_bits(self._algorithm, round_index - 1, self._params)
        down, up = (cohort_size if receivers is None else receivers) * down, cohort_size * up
        flops = self._flops * (cohort_size / self._slots if self._slots else 1.0)
        self._down += down
        self._up += up
        self._total_flops += flops
        return {"bits_down": down, "bits_up": up, "bytes_down": down / 8, "bytes_up": up / 8,
                "flops": flops}

    def totals(self) -> dict[str, float]:
        """Every round so far: bits each way ('downlink_bits', 'uplink_bits'), bytes both ways
        ('bytes') and FLOPs ('total_flops')."""
        return {"downlink_bits": self._down, "uplink_bits": self._up,
                "bytes": (self._down + self._up) / 8, "total_flops": self._total_flops}


def results_table(evaluations: list[dict[str, Any]], title: str,
                  target: float | None = None) -> str:
    """A plain-text table of the evaluations (comm: communication rounds so far, FedGA's extra
    exchange included; with personalized evaluation, the mean test accuracy of existing and new
    users after fine-tuning; the megabits sent up and down so far; with a clock, the simulated
    time; with DP, the epsilon spent at the run's delta), with the best and final accuracy and,
    for a ``target`` accuracy,
    the rounds, bytes, FLOPs and seconds it took to reach it."""
    users = [group for group in ("existing", "new")
             if evaluations and f"{group}_test_acc" in evaluations[-1]]
    last = evaluations[-1] if evaluations else {}
    optional = [(key, head, spec) for key, head, spec in (
        ("uplink_bits", "up Mbit", ".4g"), ("downlink_bits", "down Mbit", ".4g"),
        ("sim_time", "sim time", ".1f"), ("epsilon", "epsilon", ".3f")) if key in last]
    lines = [title, f"{'round':>6}  {'comm':>6}  {'test acc':>8}  {'test loss':>9}  "
                    + "".join(f"{head:>9}  " for _, head, _ in optional)
                    + "".join(f"{group:>8}  " for group in users) + f"{'time (s)':>8}"]
    for e in evaluations:
        comm = e.get("communication_rounds", e["round"])
        lines.append(f"{e['round']:>6}  {comm:>6}  {e['accuracy']:>8.4f}  {e['loss']:>9.4f}  "
                     + "".join(format(e[key] / (1e6 if key.endswith("bits") else 1),
                                      f">9{spec}") + "  " for key, _, spec in optional)
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


