"""Federated data on device: examples stored once, clients as (offset, count) into an index.

``x``/``y`` hold the dataset's examples once. ``index`` lists, client after client, the example
ids each client holds (a split with replacement may list an example under several clients without
copying it); client i holds ``index[offset[i] : offset[i] + count[i]]``. Nothing is padded to the
largest client.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fljax.errors import FljaxError


class FederatedData(NamedTuple):
    x: Any             # [N, ...] examples: float32 (float64 under jax_enable_x64) or integer
                       #   (tokens); or a dict of such arrays (a graph's nodes and edges)
    y: jax.Array       # [N] int32 labels, or [N, ...] one per position; -1: not scored
    index: jax.Array   # [sum_i n_i] int32 example ids, clients contiguous
    offset: jax.Array  # [C] int32 start of each client in ``index``
    count: jax.Array   # [C] int32 n_i

    @property
    def num_clients(self) -> int:
        return int(self.count.shape[0])

    def client_indices(self, client: int) -> np.ndarray:
        """Example ids of one client (host-side, for inspection and references)."""
        start = int(self.offset[client])
        return np.asarray(self.index[start:start + int(self.count[client])])


def take(x, ids: jax.Array):
    """The examples ``ids`` of inputs ``x`` (an array or a dict of arrays)."""
    return jax.tree.map(lambda a: a[ids], x)


def as_device_inputs(x):
    """Inputs on device: floating arrays in the default float dtype (float32, float64 under
    jax_enable_x64), integer arrays (tokens, node ids) as int32, booleans kept."""
    float_dtype = jax.dtypes.canonicalize_dtype(jnp.float64)

    def put(a):
        a = np.asarray(a)
        if np.issubdtype(a.dtype, np.floating):
            return jnp.asarray(a, float_dtype)
        return jnp.asarray(a, jnp.int32 if np.issubdtype(a.dtype, np.integer) else a.dtype)

    return jax.tree.map(put, x)


def federate(x, y: np.ndarray, parts: Sequence[np.ndarray],
             num_classes: int | None = None) -> FederatedData:
    """Put examples and a partition (one index array per client) on device, checking both.

    ``x``: an array [N, ...] or a dict of them; ``y``: int labels [N] or [N, ...], -1 for none."""
    leaves = jax.tree.leaves(x)
    y = np.asarray(y)
    if not leaves:
        raise FljaxError("features are empty: give an array [N, ...] or a dict of them")
    n = np.shape(leaves[0])[0] if np.ndim(leaves[0]) else 0
    for leaf in leaves:
        leaf = np.asarray(leaf)
        if leaf.ndim < 2 or leaf.shape[0] != n:
            raise FljaxError(f"features must have shape [N, ...] with at least 2 dims and one N "
                             f"for every input array, got {leaf.shape} (N = {n})")
        if np.issubdtype(leaf.dtype, np.floating) and not np.all(np.isfinite(leaf)):
            raise FljaxError(f"features contain {int((~np.isfinite(leaf)).sum())} NaN or Inf "
                             f"values")
    if y.ndim < 1 or y.shape[0] != n:
        raise FljaxError(f"labels must have shape [{n}] or [{n}, ...] to match features, got "
                         f"{y.shape}")
    if not np.issubdtype(y.dtype, np.integer):
        raise FljaxError(f"labels must be integers, got dtype {y.dtype}")
    if y.size and (y.min() < -1 or (num_classes is not None and y.max() >= num_classes)):
        raise FljaxError(f"labels must lie in [0, {num_classes}) (-1: not scored), got range "
                         f"[{y.min()}, {y.max()}]")
    index, offset, count = _layout(parts, n)
    return FederatedData(x=as_device_inputs(x), y=jnp.asarray(y, jnp.int32),
                         index=index, offset=offset, count=count)


def with_parts(data: FederatedData, parts: Sequence[np.ndarray]) -> FederatedData:
    """The same examples (no copy) held by clients as ``parts`` says (e.g. each user's test split)."""
    index, offset, count = _layout(parts, data.y.shape[0])
    return data._replace(index=index, offset=offset, count=count)


def _layout(parts: Sequence[np.ndarray], num_examples: int):
    """(index, offset, count) device arrays of a partition, checked: no client empty, ids in range."""
    if len(parts) == 0:
        raise FljaxError("the partition has no clients")
    counts = np.array([len(p) for p in parts], np.int64)
    if counts.min() == 0:
        empty = np.flatnonzero(counts == 0)
        raise FljaxError(f"the partition leaves {len(empty)} client(s) empty (first: client "
                         f"{int(empty[0])}); use fewer clients or a larger min_size")
    index = np.concatenate([np.asarray(p, np.int64) for p in parts])
    if index.min() < 0 or index.max() >= num_examples:
        raise FljaxError(f"partition indices must lie in [0, {num_examples}), got range "
                         f"[{index.min()}, {index.max()}]")
    offset = np.concatenate([[0], np.cumsum(counts)[:-1]])
    return (jnp.asarray(index, jnp.int32), jnp.asarray(offset, jnp.int32),
            jnp.asarray(counts, jnp.int32))
