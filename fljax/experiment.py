"""From an ExperimentConfig to the pieces of a run: data, model, algorithm, round and evaluator."""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import numpy as np

from fljax import algorithms
from fljax.config import ExperimentConfig, server_optimizer_factory
from fljax.data import loaders, partition
from fljax.data.federated import FederatedData, federate
from fljax.engine import RoundFunction, RoundState, init_state, make_round
from fljax.errors import FljaxError
from fljax.evaluate import make_evaluator
from fljax.models import Model, make_model


class Experiment(NamedTuple):
    config: ExperimentConfig
    dataset: loaders.Dataset
    data: FederatedData
    model: Model
    algorithm: algorithms.Algorithm
    round_fn: RoundFunction
    evaluate: Callable
    initial_state: Callable[[], RoundState]


def split_clients(config: ExperimentConfig, labels: np.ndarray) -> list[np.ndarray]:
    """The partition named by the config."""
    if config.partition == "iid":
        return partition.iid(labels, config.num_clients, seed=config.seed)
    if config.partition == "dirichlet":
        return partition.dirichlet(labels, config.num_clients, config.alpha, seed=config.seed,
                                   min_size=config.min_size)
    if config.partition == "dirichlet_balanced":
        return partition.dirichlet_balanced(labels, config.num_clients, config.alpha,
                                            seed=config.seed, replacement=config.replacement)
    return partition.classes_per_client(labels, config.num_clients, config.classes_per_client,
                                        seed=config.seed)


def build_algorithm(config: ExperimentConfig) -> algorithms.Algorithm:
    """The algorithm named by the config, with its local and server optimizers."""
    if config.algorithm == "fedsgd":
        return algorithms.fedsgd(config.lr)
    client = algorithms.local_sgd(config.lr, round_decay=config.lr_decay,
                                  momentum=config.momentum, weight_decay=config.weight_decay,
                                  clip_norm=config.clip_norm)
    factory = server_optimizer_factory(config.server_optimizer)
    try:
        server = factory(learning_rate=config.server_lr, **config.server_optimizer_kwargs())
    except TypeError as e:
        raise FljaxError(f"server_optimizer {config.server_optimizer!r} does not take "
                         f"{config.server_optimizer_args}: {e}") from None
    return algorithms.fedavg(client, server)


def build(config: ExperimentConfig, algorithm: algorithms.Algorithm | None = None) -> Experiment:
    """Load and split the data, build model, algorithm, round function and evaluator.

    ``algorithm`` replaces the one the config names (a new algorithm under research); local work,
    data and everything else still come from the config.
    """
    config.validate()
    dataset = loaders.load_dataset(config.dataset, data_dir=config.data_dir)
    if config.num_clients > len(dataset.y_train):
        raise FljaxError(f"num_clients ({config.num_clients}) must be <= the number of training "
                         f"examples ({len(dataset.y_train)})")
    parts = split_clients(config, dataset.y_train)
    data = federate(dataset.x_train, dataset.y_train, parts, dataset.num_classes)
    model = make_model(config.model, dataset.x_train.shape[1:], dataset.num_classes,
                       conv_impl=config.conv_impl)
    algorithm = algorithm or build_algorithm(config)
    fedsgd = config.algorithm == "fedsgd"
    round_fn = make_round(
        algorithm, model, data, clients_per_round=config.clients_per_round,
        batch_size=None if fedsgd or config.batch_size == 0 else config.batch_size,
        local_steps=1 if fedsgd else config.local_steps,
        local_epochs=None if fedsgd else config.local_epochs,
        aggregation=config.aggregation, client_chunk=config.client_chunk,
        num_devices=config.num_devices)
    evaluate = make_evaluator(model, dataset.x_test, dataset.y_test)

    def initial_state() -> RoundState:
        params = model.init(jax.random.PRNGKey(config.seed))
        state = init_state(algorithm, params, data.num_clients, config.seed)
        return round_fn.place(state)

    return Experiment(config, dataset, data, model, algorithm, round_fn, evaluate, initial_state)
