"""Batched runs: R independent runs of one experiment in one compiled program.

A batched round (``fljax.make_round(..., runs=R)``) holds every run's state stacked on a leading
run axis: run r is ``take(state, r)``. Each run has its own seed (initial model, cohorts, batches,
noise), its own hyperparameter values (``RoundState.hparams``, traced scalars from which the
round builds the run's algorithm, ``fljax.hyperparams``) and possibly its own client split: data
that differ between runs (another seed's partition) are stacked too, padded to the largest run,
and data that all runs share (the examples themselves) are held once.

This module holds the pieces that move between one run and a batch of them: stacking and taking
states, stacking data, the hyperparameter arrays, and ``batch_runs``, which turns a round step into
the batched round ``make_round(..., runs=R)`` compiles.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P

from fljax.core.placement import RUNS, client_mesh, put
from fljax.data.federated import FederatedData
from fljax.errors import FljaxError
from fljax.hyperparams import is_number


def take(tree: Any, run: int) -> Any:
    """Run ``run``'s slice of a batched pytree (every leaf's row ``run``). A leaf whose runs are
    spread over devices gives the row from the one device that holds it: indexing the whole
    array would be a program over every device with a collective, and on CPU devices that share
    a few cores such a collective between rounds can wait forever for a busy device."""
    return jax.tree.map(lambda a: _row(a, run), tree)


def _row(leaf: Any, run: int) -> Any:
    shards = getattr(leaf, "addressable_shards", None)
    if shards is None or len(shards) < 2 or isinstance(leaf, jax.core.Tracer) or not leaf.ndim:
        return leaf[run]
    for shard in shards:          # the shard with row ``run`` and every other axis whole
        start, stop, _ = shard.index[0].indices(leaf.shape[0])
        if start <= run < stop and shard.data.shape[1:] == leaf.shape[1:]:
            return shard.data[run - start]
    return leaf[run]


def stack(trees: Sequence[Any]) -> Any:
    """Trees of the same structure stacked on a new leading run axis (leaves on different
    devices, e.g. rows ``take`` read from a spread batch, meet on the host first)."""
    return jax.tree.map(lambda *leaves: jnp.stack(_on_one_device(leaves)), *trees)


def _on_one_device(leaves: Sequence[Any]) -> Sequence[Any]:
    devices = {device for leaf in leaves
               if isinstance(leaf, jax.Array) and not isinstance(leaf, jax.core.Tracer)
               for device in leaf.devices()}
    return leaves if len(devices) < 2 else [np.asarray(leaf) for leaf in leaves]


def hparams_of(values: Mapping[str, Any], dtype) -> dict[str, jax.Array]:
    """A run's hyperparameters as scalar arrays: floats in ``dtype`` (the parameters' float
    dtype, so that no update changes dtype), integers (e.g. a switch round) as int32."""
    result = {}
    for name, value in values.items():
        if not is_number(value):
            raise FljaxError(f"hyperparameter {name!r} must be a number, got {value!r}")
        integer = isinstance(value, (int, np.integer)) or (
            hasattr(value, "dtype") and np.issubdtype(value.dtype, np.integer))
        result[name] = jnp.asarray(value, jnp.int32 if integer else dtype)
    return result


def run_hparams(hparams: Mapping[str, Sequence[Any]] | None, runs: int) -> list[dict[str, Any]]:
    """``{name: [value of run 0, ..., run R-1]}`` as R dicts ``{name: value}``."""
    hparams = dict(hparams or {})
    wrong = {name: len(values) for name, values in hparams.items()
             if np.ndim(values) != 1 or len(values) != runs}
    if wrong:
        raise FljaxError(f"each hyperparameter needs one value per run ({runs}), got "
                         f"{wrong} values")
    return [{name: values[r] for name, values in hparams.items()} for r in range(runs)]


def same(arrays: Sequence[Any]) -> bool:
    """Whether every array equals the first (the same object, or equal shape and values)."""
    first = arrays[0]
    return all(a is first or (np.shape(a) == np.shape(first)
                              and np.array_equal(np.asarray(a), np.asarray(first)))
               for a in arrays[1:])


def stack_data(datas: Sequence[FederatedData]) -> tuple[FederatedData, FederatedData]:
    """(data, run axes): the runs' client data in one FederatedData. A leaf every run holds
    equal is kept once (axis None); the others are stacked on a leading run axis (axis 0), each
    run's padded at the end to the longest (padding is never read: client i reads only
    ``index[offset[i]:offset[i] + count[i]]``). The runs must have the same number of clients."""
    sizes = {d.num_clients for d in datas}
    if len(sizes) != 1:
        raise FljaxError(f"the runs of a batch must have the same number of clients, got "
                         f"{sorted(sizes)}")

    def one(*leaves):
        if same(leaves):
            return leaves[0], None
        longest = max(np.shape(a)[0] for a in leaves)
        padded = [np.concatenate([np.asarray(a), np.zeros((longest - np.shape(a)[0],
                                                             *np.shape(a)[1:]), np.asarray(a).dtype)])
                  for a in leaves]
        return jnp.asarray(np.stack(padded)), 0

    pairs = jax.tree.map(one, *datas)
    is_pair = lambda node: isinstance(node, tuple) and len(node) == 2 and not isinstance(
        node, FederatedData)
    data = jax.tree.map(lambda p: p[0], pairs, is_leaf=is_pair)
    axes = jax.tree.map(lambda p: p[1], pairs, is_leaf=is_pair)
    return data, axes


def data_of(data: FederatedData, axes: FederatedData, run: int) -> FederatedData:
    """Run ``run``'s client data from a batch's (``stack_data``)."""
    return jax.tree.map(lambda axis, a: a if axis is None else a[run], axes, data,
                        is_leaf=lambda axis: axis is None)


def batch_runs(step: Callable, datas: list[FederatedData], runs: int, run_chunk: int,
               num_devices: int):
    """R runs of the round ``step(state, data, mean_examples)`` in one function: (``batched(state,
    data, means, active) -> (state, metrics)``, the data it takes (stacked where the runs' splits
    differ; over a mesh of ``num_devices`` devices, each holds its runs'), that mesh (None on one
    device), the data's run axes (None when every run shares one split), and the runs' mean
    client sizes (None when equal))."""
    data, axes = stack_data(datas) if len(datas) > 1 else (datas[0], _shared_axes(datas[0]))
    means = np.stack([np.asarray(d.count) for d in datas]).mean(axis=1)
    means = None if np.all(means == means[0]) else jnp.asarray(
        means, jax.dtypes.canonicalize_dtype(jnp.float64))
    mesh = client_mesh(num_devices, RUNS) if num_devices > 1 else None
    if mesh is not None:
        data = put(data, jax.tree.map(lambda axis: P() if axis is None else P(RUNS), axes,
                                      is_leaf=lambda a: a is None), mesh)
    batched = _batched(step, axes, means is not None, runs, run_chunk, mesh)
    return batched, data, mesh, axes if len(datas) > 1 else None, means


def _shared_axes(data: FederatedData) -> FederatedData:
    """Every leaf of ``data`` shared by the runs (vmap axis None)."""
    return jax.tree.map(lambda _: None, data)


def _batched(round_fn: Callable, data_axes: Any, per_run_means: bool, runs: int,
             run_chunk: int, mesh: Mesh | None) -> Callable:
    """``(state, data, means, active) -> (state, metrics)`` of R runs: ``round_fn`` over the
    leading run axis of the state (and of the per-run data and example means), ``run_chunk``
    runs side by side (vmap) at a time, a scan over the chunks; over a ``mesh`` (axis 'runs')
    each device takes R/D of the runs. A run whose ``active`` flag is False keeps its state."""
    axis_leaves, _ = jax.tree.flatten(data_axes, is_leaf=lambda a: a is None)

    def batched(state, data, means, active):
        leaves, tree = jax.tree.flatten(data)
        per_run = [a for a, axis in zip(leaves, axis_leaves) if axis is not None]

        def one(xs):
            run_state, run_leaves, mean = xs
            mapped = iter(run_leaves)
            run_data = jax.tree.unflatten(tree, [next(mapped) if axis is not None else a
                                                 for a, axis in zip(leaves, axis_leaves)])
            return round_fn(run_state, run_data, mean)

        xs = (state, per_run, means if per_run_means else None)
        if run_chunk == 1:    # a scan over runs: conditionals stay conditionals, and a run
            def maybe(xs_active):     # that is not active costs nothing
                xs, on = xs_active
                _, metrics_shape = jax.eval_shape(one, xs)
                idle = lambda: (xs[0], jax.tree.map(lambda m: jnp.zeros(m.shape, m.dtype),
                                                    metrics_shape))
                return jax.lax.cond(on, lambda: one(xs), idle)
            return jax.lax.map(maybe, (xs, active))
        if run_chunk >= active.shape[0]:
            new_state, metrics = jax.vmap(one)(xs)
        else:
            new_state, metrics = jax.lax.map(one, xs, batch_size=run_chunk)
        keep = lambda new, old: jnp.where(active.reshape(-1, *(1,) * (new.ndim - 1)), new, old)
        return jax.tree.map(keep, new_state, state), metrics

    if mesh is None:
        return batched
    data_specs_ = jax.tree.map(lambda axis: P() if axis is None else P(RUNS), data_axes,
                               is_leaf=lambda a: a is None)
    return jax.shard_map(batched, mesh=mesh,
                         in_specs=(P(RUNS), data_specs_, P(RUNS) if per_run_means else P(),
                                   P(RUNS)),
                         out_specs=(P(RUNS), P(RUNS)), check_vma=False)
