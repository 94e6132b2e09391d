"""Run logs: one JSON line per round and per evaluation, mirrored to TensorBoard."""

from __future__ import annotations

import json
import math
import os
from typing import Any

from tensorboardX import SummaryWriter


def read_log(path: str) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl file; a torn last line (a killed run) is skipped."""
    records = []
    if not os.path.exists(path):
        return records
    with open(path) as f:
        for line in f:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records


class RunLog:
    """Appends to ``OUT_DIR/metrics.jsonl`` and writes TensorBoard events to ``OUT_DIR/tb``.

    ``resume_round``: keep the records of rounds <= it (those the checkpoint covers) and drop the
    rest, so a resumed run's log equals an uninterrupted run's; None starts a new log.
    """

    def __init__(self, out_dir: str, resume_round: int | None):
        self.path = os.path.join(out_dir, "metrics.jsonl")
        kept = [r for r in read_log(self.path) if resume_round is not None
                and r.get("round", 0) <= resume_round]
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in kept)
        os.replace(tmp, self.path)
        self._file = open(self.path, "a")
        self._tb = SummaryWriter(os.path.join(out_dir, "tb"),
                                 purge_step=None if resume_round is None else resume_round + 1)

    def round(self, round_index: int, train_loss: float, clients: list[int], time_s: float,
              extras: dict[str, float] | None = None):
        """One round's record; ``extras``: further scalars (communication rounds, the cohort
        means of an algorithm's client metrics such as FedInit's divergence)."""
        extras = extras or {}
        self._write({"kind": "round", "round": round_index, "train_loss": train_loss,
                     "clients": clients, **extras, "time_s": time_s})
        self._tb.add_scalar("train/loss", train_loss, round_index)
        for name, value in extras.items():
            if math.isfinite(value):          # e.g. a cosine before any client has a previous
                self._tb.add_scalar(f"train/{name}", value, round_index)

    def evaluation(self, round_index: int, scores: dict[str, float], time_s: float):
        self._write({"kind": "eval", "round": round_index, **scores, "time_s": time_s})
        for name, value in scores.items():
            if math.isfinite(value):
                self._tb.add_scalar(f"test/{name}", value, round_index)
        self.flush()

    def _write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record) + "\n")

    def flush(self) -> None:
        self._file.flush()
        self._tb.flush()

    def close(self) -> None:
        self.flush()
        self._file.close()
        self._tb.close()
