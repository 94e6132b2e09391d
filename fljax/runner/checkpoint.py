"""Orbax checkpoints of the whole experiment state plus its config, safe against crashes.

A checkpoint is ``OUT_DIR/checkpoints/<round>/`` holding the state (round, key, params, server
state, every client's state) and the config as JSON. Orbax writes each one into a temporary
directory and renames it only when complete, so a kill at any moment leaves the previous
checkpoints readable; leftover temporary directories are removed on the next start. Saving is
synchronous: the round after a save donates the state's buffers, so they must be on disk first.
A checkpoint that cannot be read (damaged on disk) is passed over for the newest one that can.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import shutil
import sys
import traceback
from typing import Any

import jax
import orbax.checkpoint as ocp

from fljax.runner.config import RESUMABLE_CHANGES, current_names, resolved_values
from fljax.errors import NEW_RUN, RESUME, SPACE, FljaxError, os_reason


class Damaged(FljaxError):
    """Checkpoint ``round`` cannot be read (its config or its state)."""

    def __init__(self, round_index: int, message: str):
        super().__init__(message)
        self.round = round_index


class CalibratedRoundsChanged(FljaxError):
    """A resume with --target-epsilon whose planned rounds differ from the checkpoint's: the
    noise of the rounds left would change."""


class Checkpoints:
    """The checkpoints of one run directory."""

    def __init__(self, out_dir: str, keep: int = 3, read_only: bool = False):
        """``read_only``: only read (the directory must exist); nothing there is changed."""
        self.directory = os.path.abspath(os.path.join(out_dir, "checkpoints"))
        if os.path.exists(self.directory) and not os.path.isdir(self.directory):
            raise FljaxError(f"{self.directory!r} is not a directory, so it cannot hold the "
                             f"run's checkpoints; move it away or use another --out-dir")
        # What a write cut short (a kill, a full disk) left: removed here, before orbax starts
        # (its own clean-up runs in the background and races the next save's).
        if os.path.isdir(self.directory) and not read_only:
            for name in os.listdir(self.directory):
                if ".orbax-checkpoint-tmp" in name:
                    shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)
        try:
            with _quiet():
                options = ocp.CheckpointManagerOptions(
                    max_to_keep=keep, cleanup_tmp_directories=False,
                    enable_async_checkpointing=False, read_only=read_only, create=not read_only)
                self._manager = ocp.CheckpointManager(self.directory, options=options)
        except Exception as e:  # orbax raises many kinds on an unreadable directory
            raise FljaxError(f"checkpoint directory {self.directory!r} cannot be opened: "
                             f"{_first_line(e)}") from None

    def latest_round(self) -> int | None:
        return self._manager.latest_step()

    def save(self, round_index: int, state: Any, config: dict[str, Any]) -> None:
        """Write ``state`` and ``config`` as the checkpoint of ``round_index`` (blocking). A write
        that fails (a full disk) is a one-line FljaxError; orbax wrote into a temporary directory,
        so the older checkpoints are whole (the next start removes what it left)."""
        _ignore_abandoned_writes()
        try:
            with _quiet():
                self._manager.save(round_index, args=ocp.args.Composite(
                    state=ocp.args.StandardSave(state), config=ocp.args.JsonSave(config)),
                    force=True)
                self._manager.wait_until_finished()
        except Exception as e:  # orbax and TensorStore raise many kinds
            kept, reason = self.latest_round(), os_reason(e)
            raise FljaxError(f"cannot write checkpoint {round_index} in {self.directory!r} "
                             f"({reason or _first_line(e)}); " + (
                                 f"checkpoint {kept} and the records up to it are intact, "
                                 if kept else "") + (SPACE if reason else RESUME)) from None

    def saved_config(self, round_index: int) -> dict[str, Any]:
        """The config saved with checkpoint ``round_index``; Damaged if it cannot be read."""
        try:
            with _quiet():
                restored = self._manager.restore(round_index, args=ocp.args.Composite(
                    config=ocp.args.JsonRestore()))
        except Exception as e:
            raise Damaged(round_index, f"checkpoint {round_index} in {self.directory!r} is "
                          f"damaged or was not written by fljax: its config cannot be read "
                          f"({_first_line(e)})") from None
        return dict(restored.config)

    def restore(self, round_index: int, like: Any, config: dict[str, Any],
                defaults: dict[str, Any] | None = None, derived: tuple[str, ...] = ()) -> Any:
        """The state saved at ``round_index``, checked against this experiment first.

        ``like`` is a pytree of arrays or ShapeDtypeStructs with the expected structure; each
        array is read straight into ``like``'s sharding (a state sharded over devices and
        processes is never gathered). ``defaults`` are the values of config fields newer than the
        checkpoint. ``derived``: fields of ``like`` (a NamedTuple) that the config determines,
        whose layout may differ from the saved one (``RoundState.hparams`` holds only the values
        that differed among the runs the checkpoint's program trained): read as saved, then
        replaced by ``like``'s. Raises FljaxError for another experiment's checkpoint, Damaged
        for one that cannot be read.
        """
        check_same_experiment(self.saved_config(round_index), config, self.directory, defaults)
        abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(
            a.shape, a.dtype, sharding=getattr(a, "sharding", None)), like)
        abstract = self._as_saved(round_index, abstract, derived)
        _ignore_abandoned_reads()
        error = None
        for older in (abstract, *_without_new_empty_fields(abstract)):
            try:
                with _quiet():
                    restored = self._manager.restore(round_index, args=ocp.args.Composite(
                        state=ocp.args.StandardRestore(older)))
            except Exception as e:
                error = error or e
                continue
            state = type(like)(*restored.state, *like[len(older):]) if older is not abstract \
                else restored.state
            return state._replace(**{name: getattr(like, name) for name in derived}) if derived \
                else state
        raise Damaged(round_index, f"checkpoint {round_index} in {self.directory!r} is damaged "
                      f"or was written by another version of fljax: its state cannot be read "
                      f"({_first_line(error)})") from None

    def _as_saved(self, round_index: int, abstract: Any, derived: tuple[str, ...]) -> Any:
        """``abstract`` with each ``derived`` field laid out as checkpoint ``round_index`` saved
        it (shapes and dtypes from its metadata, ``abstract.round``'s sharding); unchanged where
        the metadata cannot be read or lacks the field (the restore then says why)."""
        if not derived:
            return abstract
        try:
            with _quiet():
                saved = ocp.StandardCheckpointer().metadata(
                    os.path.join(self.directory, str(round_index), "state")).item_metadata.tree
        except Exception:  # orbax raises many kinds; the restore then says what is wrong
            return abstract
        sharding = getattr(abstract.round, "sharding", None)
        return abstract._replace(**{name: jax.tree.map(
            lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype, sharding=sharding),
            saved[name]) for name in derived if name in saved})

    def restore_latest(self, like: Any, config: dict[str, Any],
                       defaults: dict[str, Any] | None = None,
                       derived: tuple[str, ...] = ()) -> tuple[int | None, Any, list]:
        """``(round, state, damaged)``: the newest checkpoint that restores (see :meth:`restore`)
        and the Damaged errors of the newer ones; ``(None, None, [])`` without checkpoints.

        Raises FljaxError if a checkpoint is from another experiment or none can be read.
        """
        damaged = []
        with _quiet():
            rounds = sorted(self._manager.all_steps(), reverse=True)
        for round_index in rounds:
            try:
                return round_index, self.restore(round_index, like, config, defaults,
                                                  derived), damaged
            except Damaged as e:
                damaged.append(e)
        if damaged:
            older = (f" (nor can the {len(damaged) - 1} older one(s))" if len(damaged) > 1
                     else "")
            raise FljaxError(f"{damaged[0]}{older}; {NEW_RUN}")
        return None, None, []

    def set_aside(self, round_index: int, where: str) -> str:
        """Move checkpoint ``round_index`` out of the checkpoints, into a new directory under
        ``where``; returns that directory."""
        os.makedirs(where, exist_ok=True)
        target, copy = os.path.join(where, str(round_index)), 0
        while os.path.exists(target):
            copy += 1
            target = os.path.join(where, f"{round_index}.{copy}")
        os.rename(os.path.join(self.directory, str(round_index)), target)
        with _quiet():
            self._manager.reload()
        return target

    def close(self) -> None:
        self._manager.close()


def saved_params(out_dir: str, like: Any, reset: tuple[str, ...] = ()) -> tuple[int, Any]:
    """``(round, params)``: the global model of the newest readable checkpoint of the run in
    ``out_dir`` (``--init-from``), read as ``like`` (the model's own params: every layer but the
    top-level layers ``reset``, which keep ``like``'s values, must have ``like``'s structure,
    shapes and dtypes). Reads only the params, and never changes that run's directory (it may
    still be running). Raises a one-line FljaxError naming what is missing or differs."""
    directory = os.path.abspath(os.path.join(os.path.expanduser(out_dir), "checkpoints"))
    rounds = sorted((int(name) for name in (os.listdir(directory) if os.path.isdir(directory)
                                           else ()) if name.isdigit()), reverse=True)
    if not rounds:
        raise FljaxError(f"init_from {out_dir!r} has no checkpoint (no {directory}/<round>/): "
                         f"give the --out-dir of a run that saved one")
    unknown = sorted(set(reset) - set(like))
    if unknown:
        raise FljaxError(f"init_reset {unknown} are not top-level layers of the model; its "
                         f"layers are {sorted(like)}")
    wanted = {name: layer for name, layer in like.items() if name not in reset}
    checkpointer, error = ocp.PyTreeCheckpointer(), None
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    _ignore_abandoned_reads()
    for round_index in rounds:
        path = os.path.join(directory, str(round_index), "state")
        try:
            with _quiet():
                saved = checkpointer.metadata(path).item_metadata.tree["params"]
        except Exception as e:  # orbax raises many kinds on a damaged checkpoint
            error = error or e
            continue
        _check_params_like(saved, wanted, f"init_from {out_dir!r} (round {round_index})")
        target = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device),
                              wanted)
        try:
            with _quiet():
                read = checkpointer.restore(path, args=ocp.args.PyTreeRestore(
                    {"params": target}, partial_restore=True,
                    restore_args=ocp.checkpoint_utils.construct_restore_args(
                        {"params": target})))["params"]
        except Exception as e:
            error = error or e
            continue
        return round_index, {**like, **read}
    raise FljaxError(f"init_from {out_dir!r}: no checkpoint in {directory} can be read "
                     f"({_first_line(error)})")


def _check_params_like(saved: Any, wanted: Any, where: str) -> None:
    """Raise FljaxError naming the first layer of ``wanted`` that ``saved`` (orbax metadata)
    lacks or holds with another shape or dtype."""
    saved_leaves = dict(jax.tree_util.tree_flatten_with_path(
        saved, is_leaf=lambda x: hasattr(x, "shape"))[0])
    for path, leaf in jax.tree_util.tree_flatten_with_path(wanted)[0]:
        name = "/".join(str(getattr(k, "key", k)) for k in path)
        if path not in saved_leaves:
            raise FljaxError(f"{where} has no parameter {name!r}: it is another model (set "
                             f"init_reset for layers to keep their own initialization)")
        other = saved_leaves[path]
        if tuple(other.shape) != tuple(leaf.shape) or other.dtype != leaf.dtype:
            raise FljaxError(f"{where}: parameter {name!r} is {tuple(other.shape)} "
                             f"{other.dtype} there and {tuple(leaf.shape)} {leaf.dtype} here "
                             f"(set init_reset for layers to keep their own initialization)")


def _without_new_empty_fields(like: Any) -> list[Any]:
    """``like`` (a NamedTuple) cut before each run of trailing fields that hold no arrays (e.g.
    ``RoundState.probes`` of a run without probes): how a checkpoint written before those fields
    existed is laid out. Longest first; [] for anything else."""
    if not (isinstance(like, tuple) and hasattr(like, "_fields")):
        return []
    cuts = []
    for k in range(len(like) - 1, 0, -1):
        if jax.tree.leaves(like[k]):
            break
        cuts.append(collections.namedtuple(type(like).__name__, like._fields[:k])(*like[:k]))
    return cuts


def check_same_experiment(saved: dict[str, Any], current: dict[str, Any], where: str,
                          defaults: dict[str, Any] | None = None) -> None:
    """Raise FljaxError naming the first config value that differs, other than RESUMABLE_CHANGES.

    A field missing from the saved config (added to fljax after the checkpoint was written) counts
    as its value in ``defaults``: a new field's default keeps the old behaviour; a renamed field
    counts under its current name.
    """
    saved = resolved_values({**(defaults or {}), **current_names(saved)})
    current = resolved_values(current)
    if current.get("target_epsilon") is not None and saved.get("rounds") != current.get("rounds"):
        raise CalibratedRoundsChanged(f"the checkpoint in {where!r} calibrated its DP noise to target_epsilon "
                         f"{current['target_epsilon']} over rounds={saved.get('rounds')}; "
                         f"rounds={current.get('rounds')} would change the noise of the rounds "
                         f"left: keep rounds, or give the dp wrapper's noise_multiplier")
    for key in sorted(set(saved) | set(current)):
        if key in RESUMABLE_CHANGES:
            continue
        if saved.get(key) != current.get(key):
            raise FljaxError(f"the checkpoint in {where!r} is from a different experiment: {key} "
                             f"is {saved.get(key)!r} there and {current.get(key)!r} here; "
                             f"{NEW_RUN}")


def _ignore_abandoned_reads() -> None:
    """Drop the reports of the reads orbax abandons when it gives up on a damaged checkpoint.

    Orbax stops at the first failed read; the reads still in flight are coroutines that end with
    the same TensorStore error, or ``RuntimeError('Event loop is closed')``, after the loop has
    closed, and Python reports them as unraisable exceptions from background threads or the
    garbage collector, possibly after the program has reported the error. Those reports (and only
    those: the exception of an orbax coroutine, or the closed loop) are dropped, from the first
    restore on.
    """
    previous = sys.unraisablehook
    if getattr(previous, "ignores_abandoned_reads", False):
        return

    def hook(unraisable):
        error, source = unraisable.exc_value, unraisable.object
        code = getattr(source, "cr_code", None)
        abandoned = (code is not None and "orbax" in code.co_filename) or (
            isinstance(error, RuntimeError) and str(error) == "Event loop is closed")
        if not abandoned:
            previous(unraisable)

    hook.ignores_abandoned_reads = True
    sys.unraisablehook = hook


def _ignore_abandoned_writes() -> None:
    """Drop asyncio's reports of the writes orbax abandons when one write of a save fails.

    Orbax writes an array's fragments as concurrent asyncio tasks and stops at the first failure
    (a full disk); when another fragment fails too, its task is never awaited, and asyncio logs
    "Task exception was never retrieved" with a traceback whenever the task is collected, possibly
    after fljax has reported the error. Those records (and only those: an orbax task's) are dropped.
    """
    logger = logging.getLogger("asyncio")
    if any(isinstance(f, _AbandonedOrbaxTask) for f in logger.filters):
        return
    logger.addFilter(_AbandonedOrbaxTask())


class _AbandonedOrbaxTask(logging.Filter):
    """Rejects asyncio's "Task exception was never retrieved" records of orbax's tasks."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "Task exception was never retrieved" not in message:
            return True
        raised_in = [frame.filename for frame in traceback.extract_tb(
            record.exc_info[2] if record.exc_info else None)]
        return not ("orbax" in message or any("orbax" in name for name in raised_in))


@contextlib.contextmanager
def _quiet():
    """Orbax's own log lines (absl's logger: a missing or unparsable metadata file, a failed
    write's traceback, ...) held back while fljax reads or writes checkpoints: what went wrong is
    fljax's one warning or error line."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        logger.setLevel(level)


def _first_line(error: Exception) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0][:300]
