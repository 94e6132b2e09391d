"""A run over several processes (hosts), each driving its own devices: ``jax.distributed``.

Every process runs the same program on the same config; the device mesh spans all processes'
devices (``fljax.placement``), each process puts only its own devices' shards, the round's
collectives cross processes, orbax writes each shard of a checkpoint from the process that holds
it, and only process 0 writes logs and the progress bar.
"""

from __future__ import annotations

import re

import jax

from fljax.errors import FljaxError


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
    jax.distributed.initialize(coordinator_address, num_processes, process_id)


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
