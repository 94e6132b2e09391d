"""A full disk while saving a checkpoint or appending to metrics.jsonl: one line, a non-zero exit,
the previous checkpoint and every record written before intact, and once there is room again the
same command resumes to the uninterrupted run's state and log.

The disk fills by a file-size limit (``ulimit -f``, RLIMIT_FSIZE, with SIGXFSZ ignored so that a
write past it fails with EFBIG instead of killing the process): the checkpoint's array data, or
the growing log, is the file that outgrows it.
"""

import asyncio
import gc
import logging
import os
import shlex
import subprocess
import sys

import jax
import pytest

from fljax.runner.checkpoint import Checkpoints, _ignore_abandoned_writes
from fljax.runner.cli import main
from fljax.runner.config import ExperimentConfig
from tests.test_resume import final_state, records

RUN = ["--checkpoint-every", "2", "--eval-every", "1", "--quiet", "--num-clients", "10",
       "--clients-per-round", "4", "--local-epochs", "1"]


def limited_run(out_dir: str, rounds: int, kilobytes: int) -> subprocess.CompletedProcess:
    """The CLI in a child process whose files may not grow past ``kilobytes`` (bash's
    ``ulimit -f``, SIGXFSZ ignored; no compilation cache: its entries are files too)."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    command = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "fljax", *RUN, "--rounds",
                                                str(rounds), "--out-dir", out_dir])
    return subprocess.run(["bash", "-c", f"ulimit -f {kilobytes}; trap '' XFSZ; exec {command}"],
                          env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("whole") / "run")
    assert main(RUN + ["--rounds", "6", "--out-dir", out]) == 0
    return out


def snapshot(run_dir):
    """Every checkpoint's files and the log's committed records."""
    files = {}
    for root, _, names in os.walk(os.path.join(run_dir, "checkpoints")):
        for name in names:
            with open(os.path.join(root, name), "rb") as f:
                files[os.path.relpath(os.path.join(root, name), run_dir)] = f.read()
    return files, records(run_dir)


@pytest.mark.parametrize("full", ["checkpoint", "log"])
def test_a_full_disk_is_one_line_loses_nothing_and_the_resume_is_bit_identical(
        full, uninterrupted, tmp_path):
    run_dir = str(tmp_path / "run")
    assert main(RUN + ["--rounds", "4", "--out-dir", run_dir]) == 0   # checkpoints 2 and 4
    before_files, before_records = snapshot(run_dir)
    config = ExperimentConfig().replace(rounds=6, checkpoint_every=2, eval_every=1,
                                        num_clients=10, clients_per_round=4, local_epochs=1)
    # checkpoint: a limit of half the state's largest array, which checkpoint 6 writes whole into
    # one file (orbax packs whole arrays into its data files, however it groups them); every
    # other file stays far below it. log: metrics.jsonl (~2.5 kB) outgrows the kilobyte it
    # started in (config.json, 1.5 kB, fits)
    largest = max(leaf.nbytes for leaf in jax.tree.leaves(
        final_state(run_dir, config.replace(out_dir=run_dir))))
    assert largest > 64 * 1024, largest        # far above the log's and the metadata's files
    size = largest // 2048 if full == "checkpoint" else 1 + os.path.getsize(
        os.path.join(run_dir, "metrics.jsonl")) // 1024
    done = limited_run(run_dir, 6, size)
    err = done.stderr.splitlines()
    assert done.returncode == 2 and len(err) == 1, done.stderr[-3000:]
    what = "cannot write checkpoint 6" if full == "checkpoint" else "metrics.jsonl' (File too"
    assert err[0].startswith("fljax: error: cannot write") and what in err[0], err[0]
    assert "run the same command again to resume" in err[0]
    files, logged = snapshot(run_dir)
    assert {k: v for k, v in files.items() if ".orbax-checkpoint-tmp" not in k} == before_files
    assert logged[:len(before_records)] == before_records      # every committed record intact
    assert Checkpoints(run_dir).latest_round() == 4
    assert main(RUN + ["--rounds", "6", "--out-dir", run_dir]) == 0       # room again
    want = final_state(uninterrupted, config.replace(out_dir=uninterrupted))
    got = final_state(run_dir, config.replace(out_dir=run_dir))
    assert all((a == b).all() for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)))
    assert records(run_dir) == records(uninterrupted)
    assert not [d for d in os.listdir(os.path.join(run_dir, "checkpoints")) if "tmp" in d]


def abandoned_task(filename: str) -> None:
    """A task whose coroutine (compiled as if it lived in ``filename``) fails and is never awaited,
    then collected: asyncio logs "Task exception was never retrieved", as for a fragment write that
    orbax abandons once another one has failed."""
    namespace = {}
    exec(compile("async def write_fragment():\n    raise ValueError('Failed writing')\n",
                 filename, "exec"), namespace)
    loop = asyncio.new_event_loop()
    task = loop.create_task(namespace["write_fragment"]())
    loop.run_until_complete(asyncio.sleep(0))
    loop.close()
    del task
    gc.collect()


def test_only_the_reports_of_orbax_abandoned_writes_are_dropped(caplog, monkeypatch):
    """A failed save drops asyncio's reports of orbax's abandoned writes (they would follow the
    one-line error), and no other task's."""
    monkeypatch.setattr(logging.getLogger("asyncio"), "filters", [])   # as before any failed save
    caplog.set_level(logging.ERROR, logger="asyncio")
    abandoned_task("/site-packages/orbax/checkpoint/_src/serialization/serialization.py")
    assert [r for r in caplog.records if "never retrieved" in r.getMessage()]   # asyncio reports it
    caplog.clear()
    _ignore_abandoned_writes()
    abandoned_task("/site-packages/orbax/checkpoint/_src/serialization/serialization.py")
    abandoned_task("/home/researcher/my_algorithm.py")
    reports = [r.getMessage() for r in caplog.records if "never retrieved" in r.getMessage()]
    assert len(reports) == 1 and "my_algorithm.py" in reports[0], reports
