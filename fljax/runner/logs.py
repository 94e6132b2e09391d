"""Run logs: one JSON line per round and per evaluation, mirrored to TensorBoard.

Both are written synchronously; :meth:`RunLog.commit` puts everything logged so far on disk, and
the runner calls it before each checkpoint, so a checkpoint never covers a record that a crash
could still lose.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any

from tensorboardX.event_file_writer import EventsWriter
from tensorboardX.proto.event_pb2 import Event, SessionLog
from tensorboardX.proto.summary_pb2 import Summary

from fljax.errors import FljaxError, writing


def read_log(path: str) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl file ([] if there is none).

    A last line without its newline is a write cut short by a kill and is skipped; any other line
    that is not a UTF-8 JSON object raises FljaxError naming the file and the line.
    """
    if not os.path.exists(path):
        return []
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    records = []
    for number, line in enumerate(lines[:-1], start=1):   # lines[-1]: after the last newline
        try:
            record = json.loads(line.decode("utf-8"))
        except ValueError as e:   # JSONDecodeError, UnicodeDecodeError
            record = e
        if not isinstance(record, dict):
            reason = f": {record}" if isinstance(record, ValueError) else ""
            raise FljaxError(f"line {number} of {path!r} is damaged (not a JSON record"
                             f"{reason}); repair that line, or start over with --fresh")
        records.append(record)
    return records


class RunLog:
    """Appends to ``OUT_DIR/metrics.jsonl`` and writes TensorBoard events to ``OUT_DIR/tb``.

    ``resume_round``: keep the records of rounds <= it (those the checkpoint covers) and drop the
    rest, so a resumed run's log equals an uninterrupted run's; None starts a new log. TensorBoard
    hides the earlier events of the rounds after it (a purge marker).
    """

    def __init__(self, out_dir: str, resume_round: int | None):
        self.path = os.path.join(out_dir, "metrics.jsonl")
        kept = [] if resume_round is None else [
            r for r in read_log(self.path) if r.get("round", 0) <= resume_round]
        tmp = self.path + ".tmp"
        with writing(repr(self.path)):
            with open(tmp, "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in kept)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
            self._file = open(self.path, "a")
            tb = os.path.join(out_dir, "tb")
            os.makedirs(tb, exist_ok=True)
            # One event file per session, named in time order (TensorBoard reads them so).
            self._tb = EventsWriter(os.path.join(tb, "events"), f".{time.time_ns()}")
            self._tb.write_event(Event(wall_time=time.time(), step=(resume_round or 0) + 1,
                                       session_log=SessionLog(status=SessionLog.START)))

    def round(self, round_index: int, train_loss: float, clients: list[int], time_s: float,
              extras: dict[str, float] | None = None):
        """One round's record; ``extras``: further scalars (communication rounds, the cohort
        means of an algorithm's client metrics such as FedInit's divergence)."""
        extras = extras or {}
        self._write({"kind": "round", "round": round_index, "train_loss": train_loss,
                     "clients": clients, **extras, "time_s": time_s},
                    {"train/loss": train_loss, **{f"train/{k}": v for k, v in extras.items()}})

    def evaluation(self, round_index: int, scores: dict[str, float], time_s: float):
        """One evaluation's record, flushed (not yet committed) so that it can be read at once."""
        self._write({"kind": "eval", "round": round_index, **scores, "time_s": time_s},
                    {f"test/{k}": v for k, v in scores.items()})
        with writing(repr(self.path)):
            self._file.flush()

    def _write(self, record: dict[str, Any], scalars: dict[str, float]) -> None:
        with writing(repr(self.path)):
            self._file.write(json.dumps(record) + "\n")
            self._tb.write_event(Event(
                wall_time=time.time(), step=record["round"], summary=Summary(value=[
                    Summary.Value(tag=tag, simple_value=value) for tag, value in scalars.items()
                    if math.isfinite(value)])))   # e.g. a cosine before a client has a previous

    def commit(self) -> None:
        """Put every record written so far on disk (flush and fsync both files)."""
        with writing(repr(self.path)):
            self._file.flush()
            os.fsync(self._file.fileno())
            self._tb.flush()

    def close(self) -> None:
        """Commit and close; a commit that fails here loses only records no checkpoint covers
        (every checkpoint is written after a commit), so it is not an error."""
        try:
            self.commit()
        except FljaxError:
            pass
        for file in (self._file, self._tb):
            try:
                file.close()
            except OSError:
                pass


class SilentLog(RunLog):
    """The log of a process other than process 0 in a multi-process run: it writes nothing
    (process 0 writes the run's log)."""

    def __init__(self, out_dir: str, resume_round: int | None):
        self.path = os.path.join(out_dir, "metrics.jsonl")

    def _write(self, record: dict[str, Any], scalars: dict[str, float]) -> None:
        pass

    def evaluation(self, round_index: int, scores: dict[str, float], time_s: float):
        pass

    def commit(self) -> None:
        pass

    def close(self) -> None:
        pass
