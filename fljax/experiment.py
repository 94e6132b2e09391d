"""From an ExperimentConfig to the pieces of a run: data, model, algorithm, round and evaluator."""

from __future__ import annotations

import inspect
import json
import math
import types
import typing
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
from fljax.models.mixture import mixture
from fljax.models.text import load_bert_checkpoint
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
    evaluate_validation: Callable | None = None   # the held-out validation split (tuning)


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
        # only the number of examples matters (labels may be one per position)
        return partition.iid(np.zeros(len(labels), np.int64), config.num_clients,
                             seed=config.seed)
    if np.ndim(labels) != 1:
        raise FljaxError(f"partition {config.partition!r} splits by class, but {config.dataset!r} "
                         f"has one label per position (labels of shape {np.shape(labels)}); use "
                         f"partition 'natural' or 'iid'")
    if config.partition == "dirichlet":
        return partition.dirichlet(labels, config.num_clients, config.dirichlet_alpha,
                                   seed=config.seed, min_size=config.min_size)
    if config.partition == "dirichlet_balanced":
        return partition.dirichlet_balanced(labels, config.num_clients, config.dirichlet_alpha,
                                            seed=config.seed, replacement=config.replacement)
    return partition.classes_per_client(labels, config.num_clients, config.classes_per_client,
                                        seed=config.seed)


def algorithm_factories() -> dict[str, Callable[..., algorithms.Algorithm]]:
    """Every algorithm the CLI knows, by name (the keys of config.ALGORITHMS)."""
    return {name: getattr(algorithms, name) for name in ALGORITHMS}


# What the CLI fills in rather than --algorithm-args: besides a factory's first argument (the local
# optimizer, the learning rate, or the wrapped algorithm), these arguments, and lbsgd's SGD flags.
FILLED = ("model", "server_lr", "server_optimizer", "name")
LBSGD_FLAGS = ("weight_decay", "momentum", "clip_norm")
# gradual_unfreezing takes units of parameter groups; the CLI builds them from this argument.
UNIT = inspect.Parameter("unit", inspect.Parameter.KEYWORD_ONLY, default="M", annotation="str")


def hyperparameters(name: str) -> list[inspect.Parameter]:
    """The arguments of algorithm or wrapper ``name`` (config.ALGORITHMS, config.WRAPPERS) that
    one sets in --algorithm-args or --wrappers, from its factory's signature (a required one has
    no default)."""
    parameters = list(inspect.signature(getattr(algorithms, name)).parameters.values())[1:]
    if name == "gradual_unfreezing":
        parameters = [UNIT, *parameters[1:]]
    filled = FILLED + (LBSGD_FLAGS if name == "lbsgd" else ())
    return [p for p in parameters if p.name not in filled and p.kind != p.VAR_KEYWORD]


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
        sgd = {key: getattr(config, key) for key in LBSGD_FLAGS}
        return call(name, factory, [config.lr], {**sgd, **kwargs}, {})
    local = algorithms.local_sgd(config.lr, round_decay=config.lr_decay, momentum=config.momentum,
                                 weight_decay=config.weight_decay, clip_norm=config.clip_norm)
    accepted = inspect.signature(factory).parameters
    extras = {"model": model, "server_lr": config.server_lr}
    extras = {k: v for k, v in extras.items() if k in accepted}
    if "server_optimizer" in accepted and "server_optimizer" not in kwargs:
        extras["server_optimizer"] = call(
            config.server_optimizer, server_optimizer_factory(config.server_optimizer), [],
            json_object("server_optimizer_args", config.server_optimizer_args),
            {"learning_rate": config.server_lr}, kind="server optimizer")
    return call(name, factory, [local], kwargs, extras)


def call(name: str, factory: Callable[..., algorithms.Algorithm], args: list, kwargs: dict,
         extras: dict, kind: str = "algorithm") -> algorithms.Algorithm:
    """``factory(*args, **extras, **kwargs)``, with ``kwargs`` (hyperparameters, from JSON) checked
    first: one that it does not take, one it needs and was not given, one of the wrong type (by
    the parameter's annotation, else its default) or a NaN or infinite number is a one-line
    FljaxError naming it (and listing the allowed ones)."""
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
    for parameter in parameters:
        if parameter.name in kwargs:
            check_value(f"{kind} {name!r}", parameter, kwargs[parameter.name])
    return factory(*args, **{**extras, **kwargs})


# The JSON values a type named in an annotation admits.
JSON_TYPES = {"float": (int, float), "int": (int,), "bool": (bool,), "str": (str,),
              "None": (type(None),), "NoneType": (type(None),)}


def check_value(what: str, parameter: inspect.Parameter, value) -> None:
    """Raise FljaxError unless ``value`` (read from JSON) suits ``parameter``: its type is one the
    annotation names (bool, int, float, str, None; ints pass as floats; true is no number), or
    that of its default when the annotation names none of them; a float must be finite.
    Annotations naming ``Any``, or no such type and no such default, admit any value, and so does
    a check of a value JSON cannot hold (the experiment supplied it, e.g. an array)."""
    if not isinstance(value, (bool, int, float, str, type(None), list, dict)):
        return   # not from JSON: supplied by the experiment (e.g. an array)
    names = [] if parameter.annotation is parameter.empty else alternatives(parameter.annotation)
    kinds = {t for n in names for t in JSON_TYPES.get(n, ())}
    if "Any" in names:
        kinds = set()
    elif not kinds and type(parameter.default) in (bool, int, float, str):
        kinds = set(JSON_TYPES[type(parameter.default).__name__])
    if int in kinds:
        kinds.discard(bool)   # array-like annotations name bool too; a JSON true is no number
    if kinds and (not isinstance(value, tuple(kinds))
                  or (isinstance(value, bool) and bool not in kinds)):
        allowed = [text for kind, text in ((float, "a number"), (int, "an integer"),
                                           (bool, "true or false"), (str, "a string"),
                                           (type(None), "null"))
                   if kind in kinds and not (kind is int and float in kinds)]
        raise FljaxError(f"{what}: {parameter.name} must be {' or '.join(allowed)}, got "
                         f"{json.dumps(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise FljaxError(f"{what}: {parameter.name} must be a finite number, got {value}")


def alternatives(annotation) -> list[str]:
    """The type names an annotation allows: ``'float | None'`` (text, as under ``from __future__
    import annotations``) or ``Optional[float]`` give ``['float', 'None']``; a name keeps its
    brackets (``'Sequence[int]'``)."""
    if not isinstance(annotation, str):
        union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
        return [getattr(a, "__name__", str(a))
                for a in (typing.get_args(annotation) if union else (annotation,))]
    names, depth, start = [], 0, 0
    for i, char in enumerate(annotation):
        depth += (char == "[") - (char == "]")
        if char == "|" and depth == 0:
            names.append(annotation[start:i].strip())
            start = i + 1
    return names + [annotation[start:].strip()]


def wrap(algorithm: algorithms.Algorithm, wrappers: dict,
         model: Model) -> algorithms.Algorithm:
    """Apply the config's wrappers (WRAPPERS order): FedBug's gradual unfreezing (``fraction``,
    ``unit`` 'M' or 'B' for ResNets, ``order``, ``frozen_last``), FedDecay's local decay
    (``beta``, ``schedule``, ``per``), relaxed initialization (``beta``, ``aggregate``), FedBN
    (``{}``: the model's normalization layers stay local)."""
    for wrapper in WRAPPERS:
        if wrapper not in wrappers:
            continue
        if not isinstance(wrappers[wrapper], dict):
            raise FljaxError(f"wrapper {wrapper!r} takes a JSON object of arguments, got "
                             f"{wrappers[wrapper]!r}")
        args = dict(wrappers[wrapper])
        leading = [algorithm]
        if wrapper == "gradual_unfreezing":
            leading.append(unfreeze_units(model, args.pop(UNIT.name, UNIT.default)))
        if wrapper == "fedbn":
            leading.append(jax.eval_shape(model.init, jax.random.key(0)))
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
    dataset = loaders.load_dataset(config.dataset, data_dir=config.data_dir,
                                   num_clients=config.num_clients, seed=config.seed)
    validation = None
    if config.validation_fraction > 0:
        dataset, *validation = loaders.hold_out(dataset, config.validation_fraction, config.seed)
    if config.num_clients > len(dataset.y_train):
        raise FljaxError(f"num_clients ({config.num_clients}) must be <= the number of training "
                         f"examples ({len(dataset.y_train)})")
    if config.batch_size > len(dataset.y_train):
        raise FljaxError(f"batch_size ({config.batch_size}) must be <= the number of training "
                         f"examples ({len(dataset.y_train)}), or 0 for each client's whole "
                         f"local dataset")
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
    model = make_model(config.model, jax.tree.map(lambda a: a[0], dataset.x_train),
                       dataset.num_classes, conv_impl=config.conv_impl)
    if "moon" in (config.algorithm, config.switch_to):
        model = with_projection_head(model)
    if "fedem" in (config.algorithm, config.switch_to):
        model = mixture(model, json_object("algorithm_args", config.algorithm_args).get(
            "num_components", inspect.signature(algorithms.fedem).parameters[
                "num_components"].default))
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
        probes=build_probes(config, dataset, model, data), unroll=config.unroll,
        compute_dtype=config.compute_dtype)
    evaluate = make_evaluator(model, dataset.x_test, dataset.y_test)
    evaluate_validation = None if validation is None else make_evaluator(model, *validation)

    def initial_params():
        params = model.init(jax.random.PRNGKey(config.seed))
        if config.pretrained is not None:
            params = load_bert_checkpoint(config.pretrained, params)
        return params

    if config.pretrained is not None:
        if config.model != "bert_tiny":
            raise FljaxError(f"--pretrained loads BERT weights into model bert_tiny; model "
                             f"{config.model!r} takes none")
        jax.eval_shape(initial_params)       # a missing or wrong checkpoint fails here, at once

    evaluate_users = None
    if users is not None:
        finetune = algorithms.local_sgd(config.finetune_lr, momentum=config.momentum,
                                        weight_decay=config.weight_decay,
                                        clip_norm=config.clip_norm).chain(0)
        fresh = None
        if algorithm.personal_model is not None:   # a client that never trained
            fresh = algorithm.client_init(initial_params())
        evaluate_users = make_user_evaluator(
            model, data, users, finetune=finetune, steps=config.finetune_steps,
            batch_size=None if config.batch_size == 0 else config.batch_size,
            personal_model=algorithm.personal_model, fresh_state=fresh, adapt=algorithm.adapt)

    def initial_state() -> RoundState:
        return round_fn.init_state(initial_params(), config.seed)

    return Experiment(config, dataset, data, model, algorithm, round_fn, evaluate, initial_state,
                      evaluate_users, evaluate_validation)
