"""From an ExperimentConfig to the pieces of a run: data, model, algorithm, round and evaluator."""

from __future__ import annotations

import inspect
from typing import Callable, NamedTuple

import jax
import numpy as np

from fljax import algorithms, probes
from fljax.config import (ALGORITHMS, FULL_BATCH, WRAPPERS, ExperimentConfig, json_object,
                          server_optimizer_factory)
from fljax.data import loaders, partition
from fljax.data.augment import named_augmentation
from fljax.data.federated import FederatedData, federate
from fljax.data.users import split_users
from fljax.engine import RoundFunction, RoundState, make_round
from fljax.errors import FljaxError
from fljax.evaluate import make_evaluator
from fljax.models import Model, make_model
from fljax.models.unfreeze import unfreeze_units
from fljax.models.heads import with_projection_head
from fljax.personalize import make_user_evaluator
from fljax.probes import Probe


class Experiment(NamedTuple):
    config: ExperimentConfig
    dataset: loaders.Dataset
    data: FederatedData
    model: Model
    algorithm: algorithms.Algorithm
    round_fn: RoundFunction
    evaluate: Callable
    initial_state: Callable[[], RoundState]
    evaluate_users: Callable | None = None   # personalized evaluation (fljax.personalize)


def split_clients(config: ExperimentConfig, labels: np.ndarray,
                  users: np.ndarray | None = None) -> list[np.ndarray]:
    """The partition named by the config; 'natural' takes the dataset's users (one client each)."""
    if config.partition == "natural":
        if users is None:
            raise FljaxError(f"partition 'natural' needs a dataset that comes with its users "
                             f"(e.g. synthetic_1_1); {config.dataset!r} has none, so split it "
                             f"with another partition")
        return partition.natural(users, config.num_clients)
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


def algorithm_factories() -> dict[str, Callable[..., algorithms.Algorithm]]:
    """Every algorithm the CLI knows, by name (the keys of config.ALGORITHMS)."""
    return {name: getattr(algorithms, name) for name in ALGORITHMS}


def make_algorithm(name: str, kwargs: dict, config: ExperimentConfig,
                   model: Model) -> algorithms.Algorithm:
    """Call the factory ``name`` with the config's local optimizer and ``kwargs``.

    What a factory takes beyond its hyperparameters is filled in from the experiment: ``model``
    (feature regularizers), ``server_lr`` and
    ``server_optimizer`` (from --server-lr / --server-optimizer) unless given in ``kwargs``.
    The full-batch algorithms (FedSGD, large-batch SGD) take the lr and SGD settings directly.
    """
    factory = algorithm_factories()[name]
    if name == "fedsgd":
        return call(name, factory, [config.lr], kwargs, {})
    if name == "lbsgd":
        sgd = dict(weight_decay=config.weight_decay, momentum=config.momentum,
                   clip_norm=config.clip_norm)
        return call(name, factory, [config.lr], {**sgd, **kwargs}, {})
    local = algorithms.local_sgd(config.lr, round_decay=config.lr_decay, momentum=config.momentum,
                                 weight_decay=config.weight_decay, clip_norm=config.clip_norm)
    accepted = inspect.signature(factory).parameters
    extras = {"model": model, "server_lr": config.server_lr}
    extras = {k: v for k, v in extras.items() if k in accepted}
    if "server_optimizer" in accepted and "server_optimizer" not in kwargs:
        optimizer = server_optimizer_factory(config.server_optimizer)
        try:
            extras["server_optimizer"] = optimizer(
                learning_rate=config.server_lr,
                **json_object("server_optimizer_args", config.server_optimizer_args))
        except TypeError as e:
            raise FljaxError(f"server_optimizer {config.server_optimizer!r} does not take "
                             f"{config.server_optimizer_args}: {e}") from None
    return call(name, factory, [local], kwargs, extras)


def call(name: str, factory: Callable[..., algorithms.Algorithm], args: list, kwargs: dict,
         extras: dict, kind: str = "algorithm") -> algorithms.Algorithm:
    """``factory(*args, **extras, **kwargs)``; a TypeError (a hyperparameter it does not take, or
    one it needs and was not given) becomes one line naming it and listing the allowed ones."""
    parameters = list(inspect.signature(factory).parameters.values())[len(args):]
    allowed = [p.name for p in parameters
               if p.kind != p.VAR_KEYWORD and p.name not in ("name", "model")]
    unknown = sorted(kwargs.keys() - set(allowed))
    missing = [p.name for p in parameters if p.default is p.empty
               and p.name not in kwargs and p.name not in extras]
    if unknown or missing:
        what = (f"does not take {unknown}" if unknown else
                f"needs {missing} in its arguments")
        raise FljaxError(f"{kind} {name!r} {what}; its hyperparameters are {allowed}")
    return factory(*args, **{**extras, **kwargs})


def wrap(algorithm: algorithms.Algorithm, wrappers: dict,
         model: Model) -> algorithms.Algorithm:
    """Apply the config's wrappers (WRAPPERS order): FedBug's gradual unfreezing (``fraction``,
    ``unit`` 'M' or 'B' for ResNets, ``order``, ``frozen_last``), FedDecay's local decay
    (``beta``, ``schedule``, ``per``), relaxed initialization (``beta``, ``aggregate``)."""
    for wrapper in WRAPPERS:
        if wrapper not in wrappers:
            continue
        if not isinstance(wrappers[wrapper], dict):
            raise FljaxError(f"wrapper {wrapper!r} takes a JSON object of arguments, got "
                             f"{wrappers[wrapper]!r}")
        args = dict(wrappers[wrapper])
        leading = [algorithm]
        if wrapper == "gradual_unfreezing":
            leading.append(unfreeze_units(model, args.pop("unit", "M")))
        algorithm = call(wrapper, getattr(algorithms, wrapper), leading, args, {},
                         kind="wrapper")
    return algorithm


def build_algorithm(config: ExperimentConfig, model: Model,
                    data: FederatedData | None = None) -> algorithms.Algorithm:
    """The algorithm named by the config, switched to ``switch_to`` at ``switch_at`` (or when
    Proposition 1's criterion ``switch_when`` holds: it needs ``data``) if set, carrying the state
    over if ``switch_carry_state``, with the config's wrappers."""
    algorithm = make_algorithm(config.algorithm,
                               json_object("algorithm_args", config.algorithm_args),
                               config, model)
    if config.switch_to is not None:
        then = make_algorithm(config.switch_to, json_object("switch_args", config.switch_args),
                              config, model)
        when = json_object("switch_when", config.switch_when)
        if when:
            criterion = call("switching_criterion", probes.switching_criterion, [],
                             criterion_args(when, config, model, data), {}, kind="switch_when")
            algorithm = algorithms.switch(algorithm, then, when=criterion,
                                          carry_state=config.switch_carry_state)
        else:
            algorithm = algorithms.switch(algorithm, then, config.switch_at,
                                          carry_state=config.switch_carry_state)
    return wrap(algorithm, json_object("wrappers", config.wrappers), model)


def criterion_args(args: dict, config: ExperimentConfig, model: Model,
                   data: FederatedData) -> dict:
    """``switching_criterion``'s arguments with what the experiment supplies: ``"optimum":
    "centralized"`` becomes ``centralized_optimum`` of the pooled training loss from the initial
    model, ``"smoothness": "estimate"`` the largest Hessian eigenvalue there (``smoothness``), and
    ``alpha`` defaults to FedDyn's (from the algorithm args, else its default)."""
    args = dict(args)
    initial = model.init(jax.random.PRNGKey(config.seed))
    if args.get("optimum") == "centralized":
        args["optimum"] = probes.centralized_optimum(model, data, initial)
    if args.get("smoothness") == "estimate":
        args["smoothness"] = probes.smoothness(model, data, initial)
    args.setdefault("alpha", json_object("algorithm_args", config.algorithm_args).get(
        "alpha", inspect.signature(algorithms.feddyn).parameters["alpha"].default))
    return args


def build_probes(config: ExperimentConfig, dataset: loaders.Dataset, model: Model,
                 data: FederatedData) -> list[Probe]:
    """The probes the config names, with their --probe-args. What a probe needs from the
    experiment is filled in unless given: the interaction tensor's ``points`` (the first
    ``num_points`` test images, default 1000); the switching criterion's as ``criterion_args``."""
    args_of = json_object("probe_args", config.probe_args)
    result = []
    for name in config.probe_names():
        args = dict(args_of.get(name, {}))
        if name == "interaction_tensor":
            args.setdefault("points", dataset.x_test[:args.pop("num_points", 1000)])
        if name == "switching_criterion":
            args = criterion_args(args, config, model, data)
        if name == "cosine_to" and isinstance(args.get("reference"), str):
            raise FljaxError("cosine_to needs per-client reference pseudo-gradients: use the "
                             "Python API (fljax.probes.cosine_to(last_pseudo_gradients(state)))")
        result.append(call(name, probes.PROBES[name], [], args, {}, kind="probe"))
    return result


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
    parts = split_clients(config, dataset.y_train, dataset.user_train)
    users = None
    if config.user_test_fraction > 0:
        users = split_users(parts, new_fraction=config.new_users, seed=config.seed,
                            val_fraction=config.user_val_fraction,
                            test_fraction=config.user_test_fraction)
        parts = [users.train[i] for i in users.existing]
        if config.clients_per_round > len(parts):
            raise FljaxError(f"clients_per_round ({config.clients_per_round}) must be <= the "
                             f"{len(parts)} existing users (num_clients={config.num_clients} "
                             f"less the new_users={config.new_users} held out)")
    data = federate(dataset.x_train, dataset.y_train, parts, dataset.num_classes)
    model = make_model(config.model, dataset.x_train.shape[1:], dataset.num_classes,
                       conv_impl=config.conv_impl)
    if "moon" in (config.algorithm, config.switch_to):
        model = with_projection_head(model)
    algorithm = algorithm or build_algorithm(config, model, data)
    full_batch = config.algorithm in FULL_BATCH
    round_fn = make_round(
        algorithm, model, data, clients_per_round=config.clients_per_round,
        batch_size=None if full_batch or config.batch_size == 0 else config.batch_size,
        local_steps=1 if full_batch else config.local_steps,
        local_epochs=None if full_batch else config.local_epochs,
        aggregation=config.aggregation, client_chunk=config.client_chunk,
        num_devices=config.num_devices, augment=named_augmentation(config.augment),
        participation=config.participation,
        probes=build_probes(config, dataset, model, data))
    evaluate = make_evaluator(model, dataset.x_test, dataset.y_test)
    evaluate_users = None
    if users is not None:
        finetune = algorithms.local_sgd(config.finetune_lr, momentum=config.momentum,
                                        weight_decay=config.weight_decay,
                                        clip_norm=config.clip_norm).chain(0)
        evaluate_users = make_user_evaluator(
            model, data, users, finetune=finetune, steps=config.finetune_steps,
            batch_size=None if config.batch_size == 0 else config.batch_size)

    def initial_state() -> RoundState:
        return round_fn.init_state(model.init(jax.random.PRNGKey(config.seed)), config.seed)

    return Experiment(config, dataset, data, model, algorithm, round_fn, evaluate, initial_state,
                      evaluate_users)
