"""A researcher's own algorithm, model, dataset and probe, outside fljax (tests/test_own_work.py).

Nothing here is special to fljax's tools: they reach these by import path
(``--algorithm tests.own_work:fedfoo``) or after ``fljax.register_*``.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

import fljax
from fljax.data import Dataset
from fljax.probes import Probe, squared_norm


@fljax.declare(aggregation="uniform")
def fedfoo(local, *, gain: float = 1.0, server_lr: float = 1.0):
    """FedFoo: FedAvg whose server step is the averaged update times ``gain``.

        w^{t+1} = w^t - server_lr * gain * sum_S p_i (w^t - y_i,K)

    with p_i = 1/|S| (an unweighted mean, declared as its paper's). gain = 1 is FedAvg."""
    base = fljax.fedavg(local)

    def server_update(params, server_state, summed, round_index):
        step = jax.tree.map(lambda d: server_lr * gain * d, summed)
        return base.server_update(params, server_state, step, round_index)

    return base._replace(name="fedfoo", server_update=server_update)


class TinyNet(nn.Module):
    """One hidden layer of ``width`` ReLU units."""

    num_classes: int
    width: int = 8

    @nn.compact
    def __call__(self, x, train: bool = False):
        x = x.reshape(x.shape[0], -1)
        return nn.Dense(self.num_classes)(nn.relu(nn.Dense(self.width)(x)))


def tiny_net(num_classes: int, input_shape: tuple):
    """The model factory: a Flax module for ``num_classes`` classes."""
    assert len(input_shape) == 1
    return TinyNet(num_classes)


def blobs(seed: int = 0) -> Dataset:
    """Three Gaussian blobs in 6 dimensions: 240 training and 60 test points (the same data for
    every seed: the seed is the split's, as for fljax's own datasets)."""
    del seed
    rng = np.random.default_rng(7)
    centres = rng.normal(size=(3, 6)) * 2
    y = rng.integers(0, 3, 300)
    x = (centres[y] + rng.normal(size=(300, 6))).astype(np.float32)
    return Dataset("blobs", x[:240], y[:240].astype(np.int32), x[240:], y[240:].astype(np.int32),
                   3)


def server_step(scale: float = 1.0) -> Probe:
    """Metric ``server_step_norm``: scale * ||w^{t+1} - w^t||."""

    def server(view):
        step = jax.tree.map(jnp.subtract, view.new_params, view.params)
        return view.state, {"server_step_norm": scale * jnp.sqrt(squared_norm(step))}

    return Probe(name="server_step", server=server)
