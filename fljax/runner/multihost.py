"""A run over several processes (hosts), each driving its own devices: ``jax.distributed``.

Every process runs the same program on the same config; the device mesh spans all processes'
devices (``fljax.core.placement``), each process puts only its own devices' shards, the round's
collectives cross processes, orbax writes each shard of a checkpoint from the process that holds
it, and only process 0 writes logs and the progress bar.

A process that stops (a crash, a kill, its host gone) would leave the others waiting in a
collective. So every process beats a heartbeat into ``jax.distributed``'s key-value store every
second and watches the others' (``Watchdog``): when one has not beaten for ``STOPPED_AFTER``
seconds (or the coordinator, process 0, cannot be reached), each process left says so in one line
and exits at once. The checkpoints are whole: orbax commits one only when every process wrote its
part, so the same commands run again resume from the newest. Ctrl-C on any process stops every
process after the same round (``agree_to_stop``), with a checkpoint.

At exit the watchdog is halted and joined (``atexit``) before the interpreter finalizes: a daemon
thread caught there inside a call into ``jax.distributed``'s C++ client is unwound by the
interpreter and aborts the finished process ("terminate called after throwing an instance of ''
... exception not rethrown", exit code -6).
"""

from __future__ import annotations

import atexit
import os
import re
import threading
import time
from typing import Callable

import jax
import numpy as np

from fljax.errors import FljaxError

BEAT = 1.0             # seconds between heartbeats
STOPPED_AFTER = 10.0   # seconds without a heartbeat after which a process has stopped
EXIT_STOPPED = 1       # the exit code of a process whose partner stopped


def start(coordinator_address: str | None, num_processes: int, process_id: int) -> None:
    """Join a run of ``num_processes`` processes as number ``process_id``, with process 0
    listening at ``coordinator_address`` ('host:port'); nothing for a single process. Call it
    before anything else uses JAX (``fljax.run`` and the CLI do)."""
    if not isinstance(num_processes, int) or num_processes < 1:
        raise FljaxError(f"num_processes must be an integer >= 1, got {num_processes!r}")
    if not isinstance(process_id, int) or not 0 <= process_id < num_processes:
        raise FljaxError(f"process_id must be an integer in [0, {num_processes - 1}], got "
                         f"{process_id!r}")
    if num_processes == 1:
        return
    if not re.fullmatch(r"[^\s:]+:\d+", coordinator_address or ""):
        raise FljaxError(f"coordinator_address must be 'host:port' (process 0's address) for "
                         f"{num_processes} processes, got {coordinator_address!r}")
    if jax.distributed.is_initialized():
        if jax.process_count() != num_processes or jax.process_index() != process_id:
            raise FljaxError(f"this process already joined a run as process "
                             f"{jax.process_index()} of {jax.process_count()}")
        return
    jax.distributed.initialize(coordinator_address, num_processes, process_id,
                               heartbeat_timeout_seconds=int(10 * STOPPED_AFTER))
    dog = Watchdog(num_processes, process_id)
    dog.start()
    atexit.register(dog.halt)     # runs before the interpreter finalizes its daemon threads


def check_devices(num_devices: int) -> None:
    """Over several processes the mesh must hold every process's devices."""
    if jax.process_count() > 1 and num_devices != jax.device_count():
        raise FljaxError(f"with {jax.process_count()} processes num_devices must be every "
                         f"process's devices ({jax.device_count()}), got {num_devices}")


def is_primary() -> bool:
    """Whether this process writes the run's logs (process 0)."""
    return jax.process_index() == 0


def barrier(name: str) -> None:
    """Wait until every process got here (nothing for a single process)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices(name)


def agree_to_stop(wanted: bool) -> bool:
    """Whether any process wants to stop (Ctrl-C on one of them): every process asks once per
    round, so all stop after the same round. ``wanted`` for a single process."""
    if jax.process_count() == 1:
        return wanted
    from jax.experimental import multihost_utils
    return bool(np.any(multihost_utils.process_allgather(np.array(wanted))))


def finished() -> None:
    """This process is done: the others' watchdogs stop watching it (it may exit before them)."""
    if Watchdog.current is not None:
        Watchdog.current.post("done", "1")


def failed(error: BaseException) -> None:
    """This process stops on ``error``. Over several processes the error may come from a partner
    that stopped (a collective that lost it): the watchdog first checks that every partner is
    alive, and if one is not, it reports that one instead (exiting). If all are, they are told
    why this one stops (and stop with one line saying so) before it exits, waiting for them to
    read it, as process 0 holds the store they read."""
    dog = Watchdog.current
    if dog is None:
        return
    if dog.partners_alive(STOPPED_AFTER + 3 * BEAT):
        dog.failed = True
        dog.post("failed", (str(error).strip().splitlines() or [type(error).__name__])[0][:200])
        time.sleep(3 * BEAT)


def on_stopped(describe: Callable[[], str]) -> None:
    """``describe()``: what the one line a process prints when a partner stopped adds (the
    newest whole checkpoint, how to resume)."""
    if Watchdog.current is not None:
        Watchdog.current.describe = describe


class Watchdog(threading.Thread):
    """Beats this process's heartbeat and watches every other process's (module docstring); when
    one stopped, prints ``fljax: error: process K of N stopped ...`` and exits this process with
    EXIT_STOPPED (its main thread may be waiting in a collective that never ends)."""

    current: "Watchdog | None" = None

    def __init__(self, num_processes: int, process_id: int):
        super().__init__(name="fljax-watchdog", daemon=True)
        from jax._src.distributed import global_state
        self._client, self._n, self._me = global_state.client, num_processes, process_id
        self.describe: Callable[[], str] = lambda: "run the same commands again to resume"
        self.failed = False           # this process stops on its own error
        self._halted = threading.Event()
        Watchdog.current = self

    def halt(self, timeout: float = 5 * BEAT) -> None:
        """Stop beating and watching, and wait (up to ``timeout`` s) for the thread to return
        from the store call it may be in (module docstring: why, at exit)."""
        self._halted.set()
        if self.is_alive():
            self.join(timeout)

    def partners_alive(self, within: float) -> bool:
        """Whether every partner beats (or finished) within ``within`` seconds; meanwhile this
        thread's watch goes on, and ends the process if one stopped."""
        first = {p: self._get_quietly(f"fljax/alive/{p}") for p in range(self._n)
                 if p != self._me}
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            time.sleep(BEAT)
            if all(self._get_quietly(f"fljax/alive/{p}") != beat
                   or self._get_quietly(f"fljax/done/{p}") is not None
                   for p, beat in first.items()):
                return True
        return False

    def _get_quietly(self, key: str):
        try:
            return self._get(key)
        except Exception:
            return None

    def post(self, what: str, value: str) -> None:
        """Tell the other processes ``what`` of this one (done, failed)."""
        try:
            self._client.key_value_set(f"fljax/{what}/{self._me}", value, allow_overwrite=True)
        except Exception:             # the store is gone: the others find out by themselves
            pass

    def run(self) -> None:
        beats, seen = 0, {p: (None, time.monotonic()) for p in range(self._n) if p != self._me}
        unreachable_since = None
        while not self._halted.is_set():
            now = time.monotonic()
            try:
                beats += 1
                self._client.key_value_set(f"fljax/alive/{self._me}", str(beats),
                                           allow_overwrite=True)
                for peer, (last, since) in list(seen.items()):
                    if since == float("inf"):
                        continue                                # it finished
                    if self._get(f"fljax/done/{peer}") is not None:
                        seen[peer] = (None, float("inf"))
                        continue
                    reason = self._get(f"fljax/failed/{peer}")
                    if reason is not None and not self.failed:
                        self.stop(f"process {peer} of {self._n} stopped: {reason}")
                    beat = self._get(f"fljax/alive/{peer}")
                    if beat != last:
                        seen[peer] = (beat, now)
                    elif now - since > STOPPED_AFTER:
                        self.stop(f"process {peer} of {self._n} stopped (no heartbeat for "
                                  f"{STOPPED_AFTER:.0f} s)")
                unreachable_since = None
            except Exception:           # the key-value store is process 0's
                unreachable_since = unreachable_since or now
                if now - unreachable_since > STOPPED_AFTER:
                    self.stop(f"process 0 of {self._n} (the coordinator) stopped (unreachable "
                              f"for {STOPPED_AFTER:.0f} s)")
            self._halted.wait(BEAT)

    def _get(self, key: str):
        try:
            return self._client.key_value_try_get(key)
        except Exception as e:          # a key not set yet is NOT_FOUND; anything else is not
            if "NOT_FOUND" in str(e) or "not found" in str(e).lower():
                return None
            raise

    def stop(self, what: str) -> None:
        try:
            more = self.describe()
        except Exception:               # the line is printed whatever the description does
            more = "run the same commands again to resume"
        os.write(2, f"fljax: error: {what}; process {self._me} stops too; {more}\n".encode())
        os._exit(EXIT_STOPPED)
