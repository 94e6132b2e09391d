"""Batched runs: R independent runs of one experiment in one compiled program.

A batched round (``fljax.make_round(..., runs=R)``) holds every run's state stacked on a leading
run axis: run r is ``take(state, r)``. Each run has its own seed (initial model, cohorts, batches,
noise), its own hyperparameter values (``RoundState.hparams``, traced scalars from which the
round builds the run's algorithm, ``fljax.hyperparams``) and possibly its own client split: data
that differ between runs (another seed's partition) are stacked too, padded to the largest run,
and data that all runs share (the examples themselves) are held once.

This module holds the pieces that move between one run and a batch of them: stacking and taking
states, stacking data, and the hyperparameter arrays.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fljax.data.federated import FederatedData
from fljax.errors import FljaxError
from fljax.hyperparams import is_number


def take(tree: Any, run: int) -> Any:
    """Run ``run``'s slice of a batched pytree (every leaf's row ``run``)."""
    return jax.tree.map(lambda a: a[run], tree)


def stack(trees: Sequence[Any]) -> Any:
    """Trees of the same structure stacked on a new leading run axis."""
    return jax.tree.map(lambda *leaves: jnp.stack(leaves), *trees)


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
