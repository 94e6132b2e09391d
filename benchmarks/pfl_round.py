"""FedAvg rounds of pfl-research's own simulation, one per request, for benchmarks/peers.py.

Runs in pfl's own environment (``bash benchmarks/pfl_env.sh``: pfl 0.6.0 and PyTorch), not in
fljax's. One process:

    yes round | head -4 | build/pfl-venv/bin/python benchmarks/pfl_round.py \\
        --image 28,28,1 --hidden 200,200 --clients 1000 --examples 50 --cohort 100 --batch 10

or pfl's multi-process simulation, launched as pfl's guide for PyTorch says (``torchrun``; on CPU
the processes reduce the clients' updates with ``torch.distributed``'s gloo backend):

    yes round | head -4 | build/pfl-venv/bin/torchrun --standalone --nnodes=1 \\
        --nproc_per_node=2 benchmarks/pfl_round.py --image 28,28,1 --hidden 200,200 ...

The model (a torch ``nn.Sequential`` on NHWC images, transposed to NCHW by its first layer as
pfl's benchmark models do): ``--model simple_cnn`` is pfl's CIFAR-10 benchmark model
(``benchmarks/model/pytorch/cnn.py``'s ``simple_cnn``: conv3x3-32, ReLU, conv3x3-64, ReLU,
maxpool 2, dropout 0.25, fc128, ReLU, dropout 0.5, fc; Glorot-uniform weights); otherwise
[conv k x k VALID -> ReLU -> maxpool 2] per width of ``--channels`` (none: an MLP on the flattened
input), ReLU dense layers of ``--hidden``, a dense output layer. The data are Gaussian images with
uniform labels, ``--examples`` per client, in a ``pfl.data.FederatedDataset`` sampled by pfl's
``minimize_reuse`` user sampler (each process trains its share of the cohort, balanced by the
clients' sizes).

FedAvg is ``pfl.algorithm.FederatedAveraging`` on a ``pfl.aggregate.simulate.SimulatedBackend``
weighting clients by examples (``WeightByDatapoints``), with ``pfl.model.pytorch.PyTorchModel``:
local ``torch.optim.SGD`` at ``--lr`` for ``--epochs`` epochs at batch ``--batch``, central
``torch.optim.SGD`` at learning rate 1 (the new global model is the weighted mean of the
clients'), no evaluation after the first round, no privacy mechanism.

Protocol (process of rank 0 only; the others follow it over ``torch.distributed``): one line
``@peer {json}`` once the model is built (its parameter count, the versions, the number of
processes), then for every line read on stdin one central iteration of pfl's ``algorithm.run``
loop, answered by ``@peer {"seconds": wall time of the round}`` from its last callback. The end
of stdin ends the run.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
import time

import numpy as np
import torch
from torch import nn

from pfl.aggregate.simulate import SimulatedBackend
from pfl.aggregate.weighting import WeightByDatapoints
from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
from pfl.callback.base import TrainingProcessCallback
from pfl.data.dataset import Dataset
from pfl.data.federated_dataset import FederatedDataset
from pfl.data.sampling import get_user_sampler
from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
from pfl.internal.ops.pytorch_ops import get_default_device
from pfl.internal.ops.selector import get_default_framework_module as get_ops
from pfl.metrics import Metrics, Weighted
from pfl.model.pytorch import PyTorchModel

from peer_protocol import NUM_CLASSES, answer, widths, workload_parser



class Transpose2D(nn.Module):
    """NHWC images -> NCHW (pfl's benchmark models take TensorFlow-style images)."""

    def forward(self, x):
        return x.permute(0, 3, 1, 2)


def simple_cnn(image: tuple[int, ...], num_outputs: int) -> nn.Sequential:
    """pfl-research's CIFAR-10 benchmark CNN (``benchmarks/model/pytorch/cnn.py``,
    ``simple_cnn``): 1,626,442 parameters on 32x32x3 with 10 outputs."""
    pooled = (image[0] - 4) // 2
    model = nn.Sequential(
        Transpose2D(), nn.Conv2d(image[-1], 32, kernel_size=(3, 3)), nn.ReLU(),
        nn.Conv2d(32, 64, kernel_size=(3, 3)), nn.ReLU(), nn.MaxPool2d((2, 2)), nn.Dropout(0.25),
        nn.Flatten(), nn.Linear(pooled * pooled * 64, 128), nn.ReLU(), nn.Dropout(0.5),
        nn.Linear(128, num_outputs))
    for module in model.modules():
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            nn.init.xavier_uniform_(module.weight)
    return model


def conv_net(image: tuple[int, ...], channels: tuple[int, ...], hidden: tuple[int, ...],
             kernel: int) -> nn.Sequential:
    """The benchmarks' CNN (an MLP when ``channels`` is empty), torch's default initialisation."""
    height, width, features = image
    layers: list[nn.Module] = [Transpose2D()] if channels else []
    for out in channels:
        layers += [nn.Conv2d(features, out, kernel), nn.ReLU(), nn.MaxPool2d(2)]
        features, height, width = out, (height - kernel + 1) // 2, (width - kernel + 1) // 2
    layers.append(nn.Flatten())
    features *= height * width
    for out in hidden:
        layers += [nn.Linear(features, out), nn.ReLU()]
        features = out
    layers.append(nn.Linear(features, NUM_CLASSES))
    return nn.Sequential(*layers)


def with_loss_and_metrics(model: nn.Module) -> nn.Module:
    """Attach the ``loss`` and ``metrics`` methods PyTorchModel calls (as pfl's benchmarks'
    ``image_classification_loss`` and ``image_classification_metrics`` do)."""
    def loss(inputs, targets, eval=False):
        model.eval() if eval else model.train()
        return nn.functional.cross_entropy(model(inputs), targets.long())

    @torch.no_grad()
    def metrics(inputs, targets, eval=True):
        model.eval() if eval else model.train()
        logits = model(inputs)
        return {"loss": Weighted(nn.functional.cross_entropy(logits, targets.long(),
                                                             reduction="sum").item(), len(inputs)),
                "accuracy": Weighted((logits.argmax(-1) == targets.long()).sum().item(),
                                     len(inputs))}

    model.loss, model.metrics = loss, metrics
    return model


def federated_data(args: argparse.Namespace) -> FederatedDataset:
    """``--clients`` clients of ``--examples`` Gaussian NHWC images with uniform labels each."""
    rng = np.random.default_rng(0)
    shape = (args.examples, *widths(args.image))
    users = {i: [rng.standard_normal(shape, dtype=np.float32),
                 rng.integers(0, NUM_CLASSES, args.examples).astype(np.int64)]
             for i in range(args.clients)}
    return FederatedDataset(lambda i: Dataset(users[i], user_id=i),
                            get_user_sampler("minimize_reuse", list(users)),
                            user_id_to_weight={i: args.examples for i in users})


class Requests:
    """Rank 0 reads one request line per round from stdin and tells the other processes (a
    broadcast over torch.distributed) whether one came; every process then runs the round."""

    def __init__(self):
        self.distributed = get_ops().distributed
        self.rank = self.distributed.global_rank

    def next(self) -> bool:
        go = torch.tensor([1 if self.rank != 0 or sys.stdin.readline() else 0])
        if self.distributed.world_size > 1:
            torch.distributed.broadcast(go, src=0)
        return bool(go.item())


class SteppedFederatedAveraging(FederatedAveraging):
    """pfl's FedAvg, each central iteration waiting for a request (none: the run ends)."""

    def __init__(self, requests: Requests):
        super().__init__()
        self.requests = requests
        self.started = None

    def get_next_central_contexts(self, model, iteration, *args, **kwargs):
        if not self.requests.next():
            return None, model, Metrics()
        self.started = time.perf_counter()
        return super().get_next_central_contexts(model, iteration, *args, **kwargs)


class Answer(TrainingProcessCallback):
    """The last callback of a central iteration: rank 0 answers the request."""

    def __init__(self, algorithm: SteppedFederatedAveraging, rank: int):
        self.algorithm, self.rank = algorithm, rank

    def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
        if self.rank == 0:
            answer({"seconds": time.perf_counter() - self.algorithm.started})
        return False, Metrics()


def main() -> None:
    parser = workload_parser(__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("conv_net", "simple_cnn"), default="conv_net")
    args = parser.parse_args()

    torch.manual_seed(0)
    image = widths(args.image)
    module = (simple_cnn(image, NUM_CLASSES) if args.model == "simple_cnn" else
              conv_net(image, widths(args.channels), widths(args.hidden), args.kernel))
    module = with_loss_and_metrics(module)
    model = PyTorchModel(model=module, local_optimizer_create=torch.optim.SGD,
                         central_optimizer=torch.optim.SGD(module.parameters(), lr=1.0))
    backend = SimulatedBackend(training_data=federated_data(args), val_data=None,
                               postprocessors=[WeightByDatapoints()])
    requests = Requests()
    algorithm = SteppedFederatedAveraging(requests)
    if requests.rank == 0:
        answer({"params": int(sum(p.numel() for p in module.parameters())),
                "processes": requests.distributed.world_size,
                "threads": torch.get_num_threads(), "device": str(get_default_device()),
                "versions": {name: importlib.metadata.version(name)
                             for name in ("pfl", "torch")}})
    algorithm.run(
        algorithm_params=NNAlgorithmParams(central_num_iterations=sys.maxsize,
                                           evaluation_frequency=sys.maxsize,
                                           train_cohort_size=args.cohort, val_cohort_size=None),
        backend=backend, model=model,
        model_train_params=NNTrainHyperParams(local_learning_rate=args.lr,
                                              local_num_epochs=args.epochs,
                                              local_batch_size=args.batch),
        model_eval_params=NNEvalHyperParams(local_batch_size=args.batch),
        callbacks=[Answer(algorithm, requests.rank)], send_metrics_to_platform=False)
    if requests.distributed.world_size > 1:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
