"""Run logs: JSONL records, TensorBoard events, and `fljax plot`."""

import glob
import os
import struct

from tensorboardX.proto.event_pb2 import Event

from fljax.runner.cli import main
from fljax.runner.logs import RunLog, read_log


def scalars(event_file):
    """{tag: [steps]} read straight from a TFRecord event file."""
    out = {}
    with open(event_file, "rb") as f:
        while header := f.read(12):
            (length,) = struct.unpack("<Q", header[:8])
            event = Event.FromString(f.read(length))
            f.read(4)
            for value in event.summary.value:
                out.setdefault(value.tag, []).append(event.step)
    return out


def test_tensorboard_and_plot(tmp_path, capsys):
    runs = []
    for alpha in ("0.1", "10"):
        out = str(tmp_path / f"alpha{alpha}")
        assert main(["--rounds", "4", "--eval-every", "2", "--dirichlet-alpha", alpha, "--quiet",
                     "--out-dir", out]) == 0
        runs.append(out)
    events = glob.glob(os.path.join(runs[0], "tb", "events.out.tfevents.*"))
    assert events
    steps = scalars(events[0])
    assert steps["train/loss"] == [1, 2, 3, 4]
    assert steps["test/accuracy"] == [2, 4] and steps["test/loss"] == [2, 4]
    png = str(tmp_path / "curves.png")
    assert main(["plot", *runs, "--out", png]) == 0
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(png) > 10_000


def test_torn_last_line_is_skipped_and_resume_truncates(tmp_path):
    log = RunLog(str(tmp_path), resume_round=None)
    for t in (1, 2, 3):
        log.round(t, 0.5, [0], 0.1)
    log.evaluation(3, {"accuracy": 0.5, "loss": 1.0}, 0.2)
    log.close()
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"kind": "round", "rou')        # a kill in the middle of a write
    assert [r["round"] for r in read_log(str(tmp_path / "metrics.jsonl"))] == [1, 2, 3, 3]
    RunLog(str(tmp_path), resume_round=2).close()
    assert [r["round"] for r in read_log(str(tmp_path / "metrics.jsonl"))] == [1, 2]
