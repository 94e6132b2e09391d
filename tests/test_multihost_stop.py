"""One process of a multi-process run stops: the others exit within a bounded time with one line
naming it, the checkpoints stay whole, and the same commands run again resume to exactly the
uninterrupted run (2 local processes x 2 CPU devices, gloo); processes that finish exit cleanly."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp

from fljax.runner.multihost import STOPPED_AFTER
from tests.test_resume import records
from tests.xla_build import xla_flags

FLAGS = ["--rounds", "8", "--checkpoint-every", "2", "--eval-every", "4", "--quiet",
         "--num-clients", "8", "--clients-per-round", "4", "--local-steps", "300",
         "--num-devices", "4", "--num-processes", "2"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def launch(out_dir: str) -> list[subprocess.Popen]:
    """Both processes of the run (each with 2 CPU devices), started together."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
    env.update(JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="2", XLA_FLAGS=xla_flags())
    address = f"localhost:{free_port()}"
    return [subprocess.Popen([sys.executable, "-m", "fljax", *FLAGS, "--coordinator-address",
                              address, "--process-id", str(i), "--out-dir", out_dir],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for i in range(2)]


def finish(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        _, err = process.communicate(timeout=300)
        assert process.returncode == 0, err[-3000:]


def saved(out_dir: str, round_index: int) -> list[np.ndarray]:
    """Every array of a checkpoint's state, read onto this process's one device."""
    path = os.path.join(out_dir, "checkpoints", str(round_index), "state")
    checkpointer = ocp.StandardCheckpointer()
    here = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=here),
                          checkpointer.metadata(path).item_metadata.tree)
    return [np.asarray(a) for a in jax.tree.leaves(checkpointer.restore(path, target))]


def test_a_killed_process_stops_the_other_in_one_line_and_the_rerun_resumes_exactly(tmp_path):
    whole = str(tmp_path / "whole")
    finish(launch(whole))
    out = str(tmp_path / "killed")
    first, second = launch(out)
    checkpoints = os.path.join(out, "checkpoints")
    deadline = time.time() + 240
    while time.time() < deadline and not (os.path.isdir(checkpoints) and "2" in os.listdir(
            checkpoints)):
        time.sleep(0.05)
    second.send_signal(signal.SIGKILL)                   # process 1, mid-run
    killed = time.monotonic()
    _, err = first.communicate(timeout=120)
    waited = time.monotonic() - killed
    second.communicate()
    assert waited < 60 and waited >= STOPPED_AFTER - 2, waited
    assert first.returncode == 1, err[-3000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fljax: error: process 1 of 2 stopped"), err
    assert "run the same commands again to resume" in lines[0]
    done = max(int(r) for r in os.listdir(checkpoints) if r.isdigit())
    assert 2 <= done < 8, "the run was not stopped mid-way"
    finish(launch(out))                                  # the same commands again
    for a, b in zip(saved(out, 8), saved(whole, 8)):
        np.testing.assert_array_equal(a, b)
    assert records(out) == records(whole)
    with open(os.path.join(out, "metrics.jsonl")) as f:
        assert [json.loads(line)["round"] for line in f
                if '"kind": "round"' in line] == list(range(1, 9))


EXIT_WHILE_WATCHING = """
import sys, time
from fljax.runner import multihost
multihost.start(sys.argv[1], 2, int(sys.argv[2]))
multihost.BEAT = 0.0          # the watchdog calls the store without pause: always inside a call
time.sleep(0.5)
multihost.finished()
"""


def test_processes_that_finish_while_their_watchdogs_call_the_store_exit_cleanly():
    """A finished process's watchdog is halted at exit before the interpreter finalizes; left
    inside a store call it is unwound there and aborts the process (exit -6, "terminate called
    ... exception not rethrown"): without the halt, 11 of 12 such processes aborted."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
    env.update(JAX_PLATFORMS="cpu")
    address = f"localhost:{free_port()}"
    processes = [subprocess.Popen([sys.executable, "-c", EXIT_WHILE_WATCHING, address, str(i)],
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for i in range(2)]
    finish(processes)
