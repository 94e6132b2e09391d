"""Where the population lives: client data and per-client state, sharded over the devices.

With D devices (a one-axis mesh named ``clients``, which may span several processes), client i
lives on device d = i // (N/D): its row of every per-client state, and its examples.
``shard_data`` lays the data out so: device d's block of ``x``/``y``/``index`` holds the
examples of its N/D clients, client after client, padded to the largest block (E rows);
``index`` and ``offset`` count from the start of the owner's block (``global_layout`` reads it as
one population). ``offset`` and ``count`` (8 bytes per client) are replicated: the cohort is sampled from
them on every device. So a device holds N/D clients' states and examples, and the round moves only
the cohort (``fljax.core.engine``).

Arrays are placed with ``jax.make_array_from_callback``: each process puts only the shards of
its own devices, from host data every process can build.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fljax.data.federated import FederatedData
from fljax.errors import FljaxError

AXIS = "clients"
RUNS = "runs"      # a batch of runs (``fljax.core.runs``) is spread over the devices on this axis


def client_mesh(num_devices: int, axis: str = AXIS) -> Mesh:
    """The first ``num_devices`` devices (of every process) as a mesh over the client axis (or
    over ``axis``: RUNS for a batch of runs, R/D runs on each device)."""
    return Mesh(np.array(jax.devices()[:num_devices]), (axis,))


def check_shardable(num_clients: int, num_devices: int) -> None:
    if num_clients % num_devices:
        raise FljaxError(f"over {num_devices} devices the number of clients ({num_clients}) must "
                         f"be a multiple of num_devices: each device holds N / num_devices "
                         f"clients")


def shard_data(data: FederatedData, num_devices: int) -> FederatedData:
    """``data`` in D equal blocks of E rows, block d holding the examples of clients
    [d N/D, (d+1) N/D) in order (an example two clients share is copied if they are on two
    devices), as host arrays. Block-local: client i reads rows ``index[offset[i] + j]`` of its
    owner's block of ``x``, ``index`` and ``offset`` counting from the start of that block."""
    index, offset, count = (np.asarray(a) for a in (data.index, data.offset, data.count))
    per = data.num_clients // num_devices
    starts = offset[::per]
    ends = offset[per - 1::per] + count[per - 1::per]
    width = int((ends - starts).max())
    rows = np.concatenate([np.concatenate([index[s:e], np.full(width - (e - s), index[s])])
                           for s, e in zip(starts, ends)])
    host = lambda a: np.asarray(a)[rows]
    return FederatedData(x=jax.tree.map(host, data.x), y=host(data.y),
                         index=np.tile(np.arange(width, dtype=np.int32), num_devices),
                         offset=(offset - np.repeat(starts, per)).astype(np.int32),
                         count=count.astype(np.int32))


def global_layout(data: FederatedData, num_devices: int) -> FederatedData:
    """The block-local layout of ``shard_data`` read as one population (``index``, ``offset``
    counted from the start of ``x``): for work over every client (probes), O(N)."""
    width = data.index.shape[0] // num_devices
    per = data.num_clients // num_devices
    block = lambda n, size: jnp.repeat(jnp.arange(num_devices, dtype=jnp.int32) * width, size,
                                       total_repeat_length=n)
    return data._replace(index=data.index + block(data.index.shape[0], width),
                         offset=data.offset + block(data.num_clients, per))


def data_specs(data: FederatedData) -> FederatedData:
    """Examples sharded over the client axis; ``offset``, ``count`` replicated."""
    return FederatedData(x=jax.tree.map(lambda _: P(AXIS), data.x), y=P(AXIS), index=P(AXIS),
                         offset=P(), count=P())


def state_specs(state) -> Any:
    """A ``RoundState``'s specs: every per-client state (the algorithm's, the probes') sharded on
    its leading (client) axis, the rest replicated."""
    clients = lambda tree: jax.tree.map(lambda _: P(AXIS), tree)
    replicated = lambda tree: jax.tree.map(lambda _: P(), tree)
    return state._replace(
        round=P(), key=P(), params=replicated(state.params),
        server_state=replicated(state.server_state),
        client_states=clients(state.client_states),
        probes={name: (replicated(server), clients(per_client))
                for name, (server, per_client) in state.probes.items()})


def put(tree: Any, specs: Any, mesh: Mesh) -> Any:
    """``tree`` (host or device arrays, the same on every process) as global arrays laid out by
    ``specs``; each process fills only its own devices' shards."""
    def one(a, spec):
        sharding = NamedSharding(mesh, spec)
        if isinstance(a, jax.Array) and a.sharding == sharding:
            return a
        host = np.asarray(a)
        return jax.make_array_from_callback(host.shape, sharding, lambda i: host[i])

    return jax.tree.map(one, tree, specs)


def to_host(tree: Any) -> Any:
    """Every array of ``tree`` whole, as numpy, on every process (gathered across processes when
    the array spans several): for evaluation and inspection, not inside the round."""
    def one(a):
        if isinstance(a, jax.Array) and not a.is_fully_addressable:
            if a.is_fully_replicated:
                return np.asarray(a.addressable_data(0))
            from jax.experimental import multihost_utils
            return np.asarray(multihost_utils.process_allgather(a, tiled=True))
        return np.asarray(a)

    return jax.tree.map(one, tree)


def device_index(sharded: bool) -> jax.Array:
    """This device's position on the client axis (0 without a mesh)."""
    return jax.lax.axis_index(AXIS) if sharded else jnp.zeros((), jnp.int32)
