"""Orbax checkpoints of the whole experiment state plus its config, safe against crashes.

A checkpoint is ``OUT_DIR/checkpoints/<round>/`` holding the state (round, key, params, server
state, every client's state) and the config as JSON. Orbax writes each one into a temporary
directory and renames it only when complete, so a kill at any moment leaves the previous
checkpoints readable; leftover temporary directories are removed on the next start. Saving is
synchronous: the round after a save donates the state's buffers, so they must be on disk first.
"""

from __future__ import annotations

import collections
import os
from typing import Any

import jax
import orbax.checkpoint as ocp

from fljax.errors import FljaxError

# Config fields that may change when a run resumes: they do not change the experiment itself.
RESUMABLE_CHANGES = frozenset({"rounds", "eval_every", "out_dir", "checkpoint_every",
                               "keep_checkpoints", "client_chunk", "num_devices",
                               "target_accuracy"})


class Checkpoints:
    """The checkpoints of one run directory."""

    def __init__(self, out_dir: str, keep: int = 3):
        self.directory = os.path.abspath(os.path.join(out_dir, "checkpoints"))
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, cleanup_tmp_directories=True,
                                               enable_async_checkpointing=False)
        try:
            self._manager = ocp.CheckpointManager(self.directory, options=options)
        except Exception as e:  # orbax raises many kinds on an unreadable directory
            raise FljaxError(f"checkpoint directory {self.directory!r} cannot be opened: "
                             f"{_first_line(e)}") from None

    def latest_round(self) -> int | None:
        return self._manager.latest_step()

    def save(self, round_index: int, state: Any, config: dict[str, Any]) -> None:
        """Write ``state`` and ``config`` as the checkpoint of ``round_index`` (blocking)."""
        self._manager.save(round_index, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), config=ocp.args.JsonSave(config)), force=True)
        self._manager.wait_until_finished()

    def saved_config(self, round_index: int) -> dict[str, Any]:
        try:
            restored = self._manager.restore(round_index, args=ocp.args.Composite(
                config=ocp.args.JsonRestore()))
        except Exception as e:
            raise FljaxError(f"checkpoint {round_index} in {self.directory!r} has no readable "
                             f"fljax config ({_first_line(e)}); it was not written by fljax or is "
                             f"damaged: use --fresh or another --out-dir") from None
        return dict(restored.config)

    def restore(self, round_index: int, like: Any, config: dict[str, Any],
                defaults: dict[str, Any] | None = None) -> Any:
        """The state saved at ``round_index``, checked against this experiment first.

        ``like`` is a pytree of arrays or ShapeDtypeStructs with the expected structure;
        ``defaults`` are the values of config fields newer than the checkpoint.
        """
        check_same_experiment(self.saved_config(round_index), config, self.directory, defaults)
        abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), like)
        error = None
        for older in (abstract, *_without_new_empty_fields(abstract)):
            try:
                restored = self._manager.restore(round_index, args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(older)))
            except Exception as e:
                error = error or e
                continue
            return type(like)(*restored.state, *like[len(older):]) if older is not abstract \
                else restored.state
        raise FljaxError(f"checkpoint {round_index} in {self.directory!r} does not fit this "
                         f"experiment's state: {_first_line(error)}") from None

    def close(self) -> None:
        self._manager.close()


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
    as its value in ``defaults``: a new field's default keeps the old behaviour.
    """
    saved = {**(defaults or {}), **saved}
    for key in sorted(set(saved) | set(current)):
        if key in RESUMABLE_CHANGES:
            continue
        if saved.get(key) != current.get(key):
            raise FljaxError(f"the checkpoint in {where!r} is from a different experiment: {key} "
                             f"is {saved.get(key)!r} there and {current.get(key)!r} here; use "
                             f"--fresh to start over or another --out-dir")


def _first_line(error: Exception) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0][:300]
