"""FedAvg rounds of FedJAX, one per request, for benchmarks/peers.py.

Runs in FedJAX's own environment (``bash benchmarks/fedjax_env.sh``: jax 0.4.30, dm-haiku 0.0.12),
not in fljax's:

    yes round | head -4 | build/fedjax-venv/bin/python benchmarks/fedjax_round.py \\
        --image 28,28,1 --hidden 200,200 --clients 1000 --examples 50 --cohort 100 --batch 10

The model is the benchmarks' CNN in haiku: [conv k x k VALID -> ReLU -> maxpool 2] per width of
``--channels`` (none: an MLP on the flattened input), ReLU dense layers of ``--hidden``, a dense
output layer. The data are Gaussian images with uniform labels, ``--examples`` per client.
FedAvg is ``fedjax.algorithms.fed_avg.federated_averaging`` with client SGD (``--lr``), server
SGD at learning rate 1 (the new global model is the example-weighted mean of the clients'), and
``--cohort`` clients drawn per round by ``fedjax.client_samplers.UniformGetClientSampler``.

Protocol: one line ``@peer {json}`` once the model is built (its parameter count and the
versions), then for every line read on stdin one round, waited for with
``jax.block_until_ready``, answered by ``@peer {"seconds": wall time of the round}``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
import time

import fedjax
import haiku as hk
import jax
import numpy as np
from fedjax.algorithms import fed_avg

from peer_protocol import NUM_CLASSES, answer, widths, workload_parser



def haiku_model(image: tuple[int, ...], channels: tuple[int, ...], hidden: tuple[int, ...],
                kernel: int) -> fedjax.Model:
    """The benchmarks' CNN (an MLP when ``channels`` is empty) as a FedJAX model."""
    def forward(batch):
        x = batch["x"]
        for width in channels:
            x = hk.Conv2D(width, kernel, padding="VALID")(x)
            x = hk.max_pool(jax.nn.relu(x), 2, 2, "VALID")
        x = hk.Flatten()(x)
        for width in hidden:
            x = jax.nn.relu(hk.Linear(width)(x))
        return hk.Linear(NUM_CLASSES)(x)

    sample = {"x": np.zeros((1, *image), np.float32), "y": np.zeros(1, np.int32)}
    return fedjax.create_model_from_haiku(
        transformed_forward_pass=hk.transform(forward), sample_batch=sample,
        train_loss=lambda batch, logits: fedjax.metrics.unreduced_cross_entropy_loss(
            batch["y"], logits))


def federated_data(args: argparse.Namespace) -> fedjax.FederatedData:
    """``--clients`` clients of ``--examples`` Gaussian images with uniform labels each."""
    rng = np.random.default_rng(0)
    shape = (args.examples, *widths(args.image))
    return fedjax.InMemoryFederatedData({
        str(i).encode(): {"x": rng.standard_normal(shape, dtype=np.float32),
                          "y": rng.integers(0, NUM_CLASSES, args.examples).astype(np.int32)}
        for i in range(args.clients)})


def main() -> None:
    args = workload_parser(__doc__.splitlines()[0]).parse_args()

    model = haiku_model(widths(args.image), widths(args.channels), widths(args.hidden),
                        args.kernel)
    data = federated_data(args)
    algorithm = fed_avg.federated_averaging(
        grad_fn=fedjax.model_grad(model),
        client_optimizer=fedjax.optimizers.sgd(args.lr),
        server_optimizer=fedjax.optimizers.sgd(1.0),
        client_batch_hparams=fedjax.ShuffleRepeatBatchHParams(batch_size=args.batch,
                                                              num_epochs=args.epochs))
    params = model.init(jax.random.PRNGKey(0))
    state = algorithm.init(params)
    sampler = fedjax.client_samplers.UniformGetClientSampler(data, args.cohort, seed=0)
    answer({"params": int(sum(np.size(p) for p in jax.tree_util.tree_leaves(params))),
            "versions": {name: importlib.metadata.version(name)
                         for name in ("fedjax", "jax", "jaxlib", "dm-haiku")}})
    for _ in sys.stdin:
        start = time.perf_counter()
        state, _ = algorithm.apply(state, sampler.sample())
        jax.block_until_ready(state.params)
        answer({"seconds": time.perf_counter() - start})


if __name__ == "__main__":
    main()
