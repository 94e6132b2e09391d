"""From an ExperimentConfig to the pieces of a run: data, model, algorithm, round and evaluator."""

from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping, NamedTuple

import jax
import numpy as np

from fljax import algorithms, probes, registry
from fljax.runner.config import FULL_BATCH, ExperimentConfig
from fljax.data import loaders, noise, partition
from fljax.data.dataset import Dataset
from fljax.data.augment import named_augmentation
from fljax.data.federated import FederatedData, federate, with_parts
from fljax.data.users import split_users
from fljax.runner.checkpoint import saved_params
from fljax.core.engine import RoundFunction, RoundState, make_round
from fljax.errors import FljaxError
from fljax.models.evaluate import make_evaluator
from fljax.runner import grouping
from fljax.models import Model, make_model
from fljax.models.unfreeze import unfreeze_units
from fljax.models.heads import with_projection_head
from fljax.models.mixture import mixture
from fljax.models.text import load_bert_checkpoint
from fljax.core.personalize import make_user_evaluator
from fljax.probes import Probe


class Experiment(NamedTuple):
    config: ExperimentConfig
    dataset: Dataset
    data: FederatedData
    model: Model
    algorithm: algorithms.Algorithm
    round_fn: RoundFunction
    evaluate: Callable
    initial_state: Callable[[], RoundState]
    evaluate_users: Callable | None = None   # personalized evaluation (fljax.core.personalize)
    evaluate_validation: Callable | None = None   # the held-out validation split (tuning)
    initial_params: Callable[[], Any] | None = None   # the run's initial model


def split_clients(config: ExperimentConfig, labels: np.ndarray,
                  users: np.ndarray | None = None) -> list[np.ndarray]:
    """The partition named by the config; 'natural' takes the dataset's users (one client each).

    A dataset file that gives its users (an .npz with client_id_train) is split by them: another
    partition is a FljaxError saying so (to re-split its pooled examples, leave the ids out of the
    file). The users of a named dataset (synthetic_*, leaf/*, planetoid/*) are pooled and split
    anew by any other partition, as the CPU-scale sweeps that stand in for a Dirichlet split do.
    """
    if users is not None and config.partition != "natural" and config.dataset.endswith(".npz"):
        count = len(np.unique(users))
        raise FljaxError(f"dataset {config.dataset!r} comes with {count} users "
                         f"(client_id_train): train on them with --partition natural "
                         f"--num-clients {count}, or leave client_id_train and client_id_test out "
                         f"of the file to split its examples by partition {config.partition!r}")
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


LBSGD_FLAGS = ("weight_decay", "momentum", "clip_norm")


def make_algorithm(name: str, kwargs: dict, config: ExperimentConfig, model: Model,
                   values: Mapping[str, Any] | None = None) -> algorithms.Algorithm:
    """Call the factory ``name`` (``fljax.registry``) with the config's local optimizer and
    ``kwargs`` (checked when the config was validated). ``values``: config keys whose value replaces the config's (traced
    hyperparameters, ``fljax.runner.grouping``): 'lr', 'server_lr', ... and for ``kwargs`` the key
    ``KWARGS_FIELD.NAME`` (e.g. 'algorithm_args.mu') as ``field`` names it.

    What a factory takes beyond its hyperparameters is filled in from the experiment: ``model``
    (feature regularizers), ``server_lr`` and ``server_optimizer`` (from --server-lr /
    --server-optimizer). The full-batch algorithms (FedSGD, large-batch SGD) take the lr and SGD
    settings directly.
    """
    value = with_values(config, values)
    factory = registry.lookup("algorithm", name)
    if name == "fedsgd":
        return factory(value["lr"], **kwargs)
    if name == "lbsgd":
        return factory(value["lr"], **{key: value[key] for key in LBSGD_FLAGS}, **kwargs)
    local = algorithms.local_sgd(value["lr"], round_decay=value["lr_decay"],
                                 momentum=value["momentum"], weight_decay=value["weight_decay"],
                                 clip_norm=value["clip_norm"],
                                 inverse_decay_offset=config.lr_decay_offset)
    accepted = inspect.signature(factory).parameters
    extras = {"model": model, "server_lr": value["server_lr"]}
    extras = {k: v for k, v in extras.items() if k in accepted}
    if "server_optimizer" in accepted:
        extras["server_optimizer"] = config.options.server_optimizer(
            learning_rate=value["server_lr"],
            **arguments(value, "server_optimizer_args", config.options.server_optimizer_args))
    return factory(local, **extras, **kwargs)


def with_values(config: ExperimentConfig, values: Mapping[str, Any] | None) -> dict[str, Any]:
    """The config's values by key (``fljax.runner.grouping.values``: fields and dotted keys of the
    JSON-valued fields' arguments), ``values`` in place of their own."""
    return {**grouping.values(config), **(values or {})}


def arguments(value: dict[str, Any], field: str, args: dict) -> dict:
    """The JSON arguments ``args`` of ``field`` as ``value`` (``with_values``) has them."""
    return {k: value[f"{field}.{k}"] for k in args}


def wrap(algorithm: algorithms.Algorithm, config: ExperimentConfig, model: Model,
         values: Mapping[str, Any] | None = None) -> algorithms.Algorithm:
    """Apply the config's wrappers (WRAPPERS order): FedBug's gradual unfreezing (``fraction``,
    ``unit`` 'M' or 'B' for ResNets, ``order``, ``frozen_last``), FedDecay's local decay
    (``beta``, ``schedule``, ``per``), relaxed initialization (``beta``, ``aggregate``), FedBN
    (``{}``: the model's normalization layers stay local), user-level DP (``clip_norm``,
    ``noise_multiplier`` or --target-epsilon, adaptive clipping's ``target_quantile``, ...; the
    expected cohort is clients_per_round)."""
    value = with_values(config, values)
    for wrapper, given in config.wrapper_args.items():
        args = arguments(value, f"wrappers.{wrapper}", given)
        leading = [algorithm]
        if wrapper == "gradual_unfreezing":
            leading.append(unfreeze_units(model, args.pop("unit", "M")))
        if wrapper == "fedbn":
            leading.append(jax.eval_shape(model.init, jax.random.key(0)))
        if wrapper == "dp":
            args["cohort_size"] = config.clients_per_round
        factory = registry.lookup("wrapper", wrapper)
        if "model" in inspect.signature(factory).parameters:
            args["model"] = model               # byzantine's label flipping: the classes
        algorithm = factory(*leading, **args)
    return algorithm


def build_algorithm(config: ExperimentConfig, model: Model, data: FederatedData | None = None,
                    values: Mapping[str, Any] | None = None) -> algorithms.Algorithm:
    """The algorithm named by the config, switched to ``switch_to`` at ``switch_at`` (or when
    Proposition 1's criterion ``switch_when`` holds: it needs ``data``) if set, with local lr
    ``switch_lr`` (default ``lr``), carrying the state over if ``switch_carry_state``, with the
    config's wrappers. ``values``: config keys whose value
    replaces the config's, e.g. traced hyperparameters ({'lr': ..., 'algorithm_args.mu': ...})."""
    options, value = config.options, with_values(config, values)
    algorithm = make_algorithm(config.algorithm,
                               arguments(value, "algorithm_args", options.algorithm_args),
                               config, model, values)
    if config.switch_to is not None:
        then_values = values if config.switch_lr is None else {
            **(values or {}), "lr": value["switch_lr"]}
        then = make_algorithm(config.switch_to,
                              arguments(value, "switch_args", options.switch_args), config,
                              model, then_values)
        if options.switch_when:
            criterion = probes.switching_criterion(
                **criterion_args(options.switch_when, config, model, data))
            algorithm = algorithms.switch(algorithm, then, when=criterion,
                                          carry_state=config.switch_carry_state)
        else:
            algorithm = algorithms.switch(algorithm, then, value["switch_at"],
                                          carry_state=config.switch_carry_state)
    return wrap(algorithm, config, model, values)


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
    args.setdefault("alpha", config.options.algorithm_args.get(
        "alpha", inspect.signature(algorithms.feddyn).parameters["alpha"].default))
    return args


def build_probes(config: ExperimentConfig, dataset: Dataset, model: Model,
                 data: FederatedData) -> list[Probe]:
    """The probes the config names, with their --probe-args. What a probe needs from the
    experiment is filled in unless given: the interaction tensor's ``points`` (the first
    ``num_points`` test images, default 1000); the switching criterion's as ``criterion_args``."""
    result = []
    for name in config.options.probes:
        args = dict(config.options.probe_args.get(name, {}))
        if name == "interaction_tensor":
            args.setdefault("points", dataset.x_test[:args.pop("num_points", 1000)])
        if name == "switching_criterion":
            args = criterion_args(args, config, model, data)
        if name == "cosine_to" and isinstance(args.get("reference"), str):
            raise FljaxError("cosine_to needs per-client reference pseudo-gradients: use the "
                             "Python API (fljax.probes.cosine_to(last_pseudo_gradients(state)))")
        result.append(registry.lookup("probe", name)(**args))
    return result


def client_parts(config: ExperimentConfig, dataset: Dataset):
    """(kept, held, parts, users): the training examples kept after the validation split (and the
    held-out ones, None without it), each client's examples (``split_clients``) and, with
    per-user evaluation, the users' splits (``fljax.data.users.split_users``; ``parts`` are then
    the existing users' training examples). Checks the population against the examples."""
    kept, held = np.arange(len(dataset.y_train)), None
    if config.validation_fraction > 0:
        kept, held = loaders.validation_split(len(dataset.y_train), config.validation_fraction,
                                              config.seed)
    if config.num_clients > len(kept):
        raise FljaxError(f"num_clients ({config.num_clients}) must be <= the number of training "
                         f"examples ({len(kept)})")
    if config.batch_size > len(kept):
        raise FljaxError(f"batch_size ({config.batch_size}) must be <= the number of training "
                         f"examples ({len(kept)}), or 0 for each client's whole local dataset")
    users_of = None if dataset.user_train is None else dataset.user_train[kept]
    parts = [kept[p] for p in split_clients(config, dataset.y_train[kept], users_of)]
    users = None
    if config.user_test_fraction > 0:
        users = split_users(parts, new_fraction=config.new_users, seed=config.seed,
                            val_fraction=config.user_val_fraction,
                            test_fraction=config.user_test_fraction,
                            roles=dataset.role_train)
        parts = [users.train[i] for i in users.existing]
        if config.clients_per_round > len(parts):
            raise FljaxError(f"clients_per_round ({config.clients_per_round}) must be <= the "
                             f"{len(parts)} existing users (num_clients={config.num_clients} "
                             f"less the new_users={config.new_users} held out)")
    return kept, held, parts, users


def experiment_dataset(config: ExperimentConfig, shared: dict) -> tuple[Dataset, tuple]:
    """(dataset, source): the dataset a validated config trains on (with FedInit's shared class
    noise) and the key it is kept under in ``shared``, loaded once per key (runs of a batch that
    differ in nothing the data depends on share it)."""
    noisy = config.client_noise > 0 or config.class_noise > 0
    user_split = ((config.user_val_fraction, config.user_test_fraction)
                  if loaders.splits_users(config.dataset) and config.user_test_fraction > 0
                  else None)
    source = (config.dataset, config.data_dir, config.num_clients,
              config.seed if loaders.depends_on_seed(config.dataset) or noisy else None,
              config.client_noise, config.class_noise, config.class_noise_reading, user_split,
              config.sample_users)
    if ("dataset", source) not in shared:
        shared["dataset", source] = with_class_noise(loaders.load_dataset(
            config.dataset, data_dir=config.data_dir, num_clients=config.num_clients,
            seed=config.seed, user_split=user_split, download=config.download,
            sample_users=config.sample_users), config)
    return shared["dataset", source], source


def build(config: ExperimentConfig, algorithm: algorithms.Algorithm | None = None,
          shared: dict | None = None) -> Experiment:
    """Load and split the data, build model, algorithm, round function and evaluator.

    ``algorithm`` replaces the one the config names (a new algorithm under research): a factory
    ``factory(local, **config's algorithm_args)`` becomes the config's algorithm (by its import
    path, ``fljax.registry``), so it is called as a named one is, with the config's local
    optimizer (lr, decay, momentum, weight decay, clipping), and its run directory records it; a
    factory that cannot be imported by its path (defined inside a function) must be registered
    first (``fljax.register_algorithm``) and named in ``config.algorithm``. A built
    ``fljax.Algorithm`` is used as it is (its own local optimizer, not the config's). Local work,
    data and everything else come from the config. ``shared``: what experiments of one batch
    (``build_batch``) load and build once: the dataset, its examples on the device, the model
    and the test-set evaluator.
    """
    if algorithm is not None and not isinstance(algorithm, algorithms.Algorithm):
        config, algorithm = config.replace(algorithm=registry.importable_path(algorithm)), None
    config = config.validate().resolved()
    shared = {} if shared is None else shared
    dataset, source = experiment_dataset(config, shared)
    _, held, parts, users = client_parts(config, dataset)
    validation = None
    if held is not None:
        validation = (jax.tree.map(lambda a: a[held], dataset.x_train), dataset.y_train[held])
    per_client_class = config.class_noise > 0 and config.class_noise_reading == "per_client"
    if config.client_noise > 0 or per_client_class:   # each client its own copies (data.noise)
        e, _ = noise.draws(config.num_clients, dataset.num_classes, dataset.x_train.shape[-1],
                           config.seed)
        offsets = (config.class_noise * noise.client_class_draws(
            config.num_clients, dataset.num_classes, config.seed) if per_client_class else None)
        data = federate(*noise.scale_clients(dataset.x_train, dataset.y_train, parts,
                                             1 + config.client_noise * e, offsets),
                        dataset.num_classes)
    elif ("examples", source) in shared:      # the examples on the device once, every split
        data = with_parts(shared["examples", source], parts)
    else:
        data = shared["examples", source] = federate(dataset.x_train, dataset.y_train, parts,
                                                     dataset.num_classes)
    model_key = ("model", source, config.model, config.conv_impl, config.algorithm,
                 config.switch_to, config.options.algorithm_args.get("num_components"))
    if model_key not in shared:
        shared[model_key] = experiment_model(config, dataset)
    model = shared[model_key]
    algorithm = algorithm or build_algorithm(config, model, data)
    round_fn = make_round(algorithm, model, data, **round_settings(config),
                          num_devices=config.num_devices,
                          probes=build_probes(config, dataset, model, data))
    if ("evaluate", model_key) not in shared:
        shared["evaluate", model_key] = make_evaluator(model, dataset.x_test, dataset.y_test)
    evaluate = shared["evaluate", model_key]
    evaluate_validation = None if validation is None else make_evaluator(
        model, *validation, like=shared.setdefault(("validation", model_key), evaluate))

    reset = tuple(name.strip() for name in config.init_reset.split(",") if name.strip())

    def initial_params():
        params = model.init(jax.random.PRNGKey(config.seed))
        if config.pretrained is not None:
            params = load_bert_checkpoint(config.pretrained, params)
        if config.init_from is not None:   # read eagerly, also under a trace (batch_memory),
            with jax.ensure_compile_time_eval():   # as host arrays: a batch may spread its
                saved = saved_params(config.init_from, jax.eval_shape(lambda: params), reset)[1]
            params = {**params, **{k: jax.device_get(v) for k, v in saved.items()   # runs
                                   if k not in reset}}                   # over devices
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
            personal_model=algorithm.personal_model, fresh_state=fresh, adapt=algorithm.adapt,
            programs=shared.setdefault(("user programs", model_key, config.finetune_lr,
                                        config.momentum, config.weight_decay,
                                        config.clip_norm), {}))

    def initial_state() -> RoundState:
        return round_fn.init_state(initial_params(), config.seed)

    return Experiment(config, dataset, data, model, algorithm, round_fn, evaluate, initial_state,
                      evaluate_users, evaluate_validation, initial_params)


def with_class_noise(dataset: Dataset, config: ExperimentConfig) -> Dataset:
    """The dataset with FedInit's category-based bias (``class_noise``) on its training and test
    images in the reading 'shared'; unchanged without it or in the reading 'per_client' (applied
    to the clients' copies in ``build``). With either noise, checks that its inputs are images."""
    for name in ("client_noise", "class_noise"):
        if getattr(config, name) > 0:
            noise.check_images(dataset.x_train, config.dataset, name)
    if config.class_noise == 0 or config.class_noise_reading != "shared":
        return dataset
    _, b = noise.draws(config.num_clients, dataset.num_classes, dataset.x_train.shape[-1],
                       config.seed)
    offsets = config.class_noise * b
    return dataset._replace(x_train=noise.brighten_classes(dataset.x_train, dataset.y_train,
                                                           offsets),
                            x_test=noise.brighten_classes(dataset.x_test, dataset.y_test,
                                                          offsets))


def experiment_model(config: ExperimentConfig, dataset: Dataset) -> Model:
    """The config's model for the dataset's inputs and classes (with MOON's projection head, or
    as FedEM's mixture, when the algorithm needs it)."""
    model = make_model(config.model, jax.tree.map(lambda a: a[0], dataset.x_train),
                       dataset.num_classes, conv_impl=config.conv_impl)
    if "moon" in (config.algorithm, config.switch_to):
        model = with_projection_head(model)
    if "fedem" in (config.algorithm, config.switch_to):
        model = mixture(model, config.options.algorithm_args.get(
            "num_components", inspect.signature(algorithms.fedem).parameters[
                "num_components"].default))
    return model


def round_settings(config: ExperimentConfig) -> dict[str, Any]:
    """``make_round``'s arguments for the config's local work, cohort and program options."""
    full_batch = config.algorithm in FULL_BATCH
    return dict(clients_per_round=config.clients_per_round,
                batch_size=None if full_batch or config.batch_size == 0 else config.batch_size,
                local_steps=1 if full_batch else config.local_steps,
                local_epochs=None if full_batch else config.local_epochs,
                aggregation=config.aggregation, client_chunk=config.client_chunk,
                augment=named_augmentation(config.augment), participation=config.participation,
                unroll=config.unroll, compute_dtype=config.compute_dtype,
                clock=config.options.clock, deadline=config.options.deadline,
                asynchrony=config.options.asynchrony)


class Batch(NamedTuple):
    """R runs of one program (``build_batch``): each run's own experiment (its data, evaluators
    and host-side algorithm) and the batched round that trains them all. The round may hold
    ``padding`` more runs (copies of the first, never active) so that the devices share the
    runs evenly."""

    experiments: list[Experiment]
    round_fn: RoundFunction          # make_round(..., runs=R + padding)
    traced: list[str]                # the config keys whose values are the runs' hparams
    padding: int = 0

    def initial_state(self) -> RoundState:
        """Every run's round 0, stacked (each run's own initial model, seed and values)."""
        runs = self.experiments + self.experiments[:1] * self.padding
        return self.round_fn.place(self.round_fn.init_state(
            [e.initial_params() for e in runs], [e.config.seed for e in runs],
            {key: [grouping.values(e.config)[key] for e in runs] for key in self.traced}))


def build_batch(configs: list[ExperimentConfig], num_devices: int = 1,
                run_chunk: int | None = None) -> Batch:
    """The experiments of ``configs`` (of one program: ``fljax.runner.grouping.structure``) and ONE
    batched round that trains them side by side (``batch_of``)."""
    shared: dict = {}
    return batch_of([build(config, shared=shared) for config in configs], num_devices, run_chunk)


def batch_of(experiments: list[Experiment], num_devices: int = 1,
             run_chunk: int | None = None) -> Batch:
    """ONE batched round that trains ``experiments`` (of one program) side by side, spread over
    ``num_devices`` devices: the values that differ between their configs
    (``fljax.runner.grouping.traced_keys``) are each run's traced hyperparameters, and each run trains
    on its own split. Build the experiments with one ``shared`` dict (``build``) so that the
    examples are on the device once."""
    first = experiments[0]
    traced = grouping.traced_keys([e.config for e in experiments])
    padding = -len(experiments) % num_devices

    def algorithm(hparams):
        return build_algorithm(first.config, first.model, first.data, hparams)

    round_fn = make_round(algorithm, first.model,
                          [e.data for e in experiments] + [first.data] * padding,
                          **round_settings(first.config), num_devices=num_devices,
                          probes=first.round_fn.probes, runs=len(experiments) + padding,
                          run_chunk=run_chunk)
    return Batch(experiments, round_fn, traced, padding)


def batch_memory(experiment: Experiment, runs: int, run_chunk: int) -> tuple[int, int]:
    """An estimate of the bytes a program of ``runs`` runs like ``experiment``'s holds: (per run,
    shared). Per run: its state twice (the round's input and output) and its split; shared: the
    examples, and the working memory of ``run_chunk`` runs' local training side by side (each
    sampled client's model, gradient and optimizer state, and a batch's inputs through the
    layers, taken as 16 copies of the batch) and, for an algorithm that aggregates its cohort side
    by side (``Algorithm.aggregate``: robust rules, attacks), the m slots' messages twice (the
    stack and a rule's working copy)."""
    state = jax.eval_shape(experiment.initial_state)
    data = experiment.data
    nbytes = lambda tree: sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(tree))
    per_run = 2 * nbytes(state) + nbytes((data.index, data.offset, data.count))
    config = experiment.config
    clients = config.client_chunk or (1 if jax.default_backend() == "cpu" else
                                      config.clients_per_round)
    batch = config.batch_size or int(np.max(np.asarray(data.count)))
    example = nbytes(jax.tree.map(lambda a: a[0], data.x))
    working = run_chunk * clients * (4 * nbytes(state.params) + 16 * batch * example)
    if experiment.algorithm.aggregate is not None:    # the cohort's messages side by side
        slots = config.num_clients if config.participation == "bernoulli" else \
            config.clients_per_round
        working += run_chunk * 2 * slots * nbytes(state.params)
    return per_run, nbytes((data.x, data.y)) + working
