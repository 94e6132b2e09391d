"""The experiment configuration read by the CLI and experiment scripts (library code never reads it)."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import optax

from fljax.data.augment import AUGMENTATIONS
from fljax.engine import PARTICIPATIONS
from fljax.errors import FljaxError
from fljax.models import CONV_IMPLS, MODEL_NAMES

PARTITIONS = ("iid", "dirichlet", "dirichlet_balanced", "classes", "natural")
ALGORITHMS = ("fedavg", "fedsgd", "fedprox", "scaffold", "feddyn", "fedavgm", "fedadam", "fedyogi",
              "fedadagrad", "fedexp", "fednova", "fedcm", "fedsam", "moon", "fedntd", "feddecorr",
              "fedinit", "fedga", "gradalign", "lbsgd", "feddecay", "fomaml", "reptile")
FULL_BATCH = ("fedsgd", "lbsgd")   # one local step on the whole local dataset
# Wrappers over any algorithm, applied innermost first: FedBug, FedDecay, relaxed init (+RI).
WRAPPERS = ("gradual_unfreezing", "local_decay", "relaxed_init")


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
    """Every knob of one federated experiment. Defaults: the README's main job."""

    # data
    dataset: str = "digits"            # 'digits' (embedded) or a prepared tfds name
    data_dir: str | None = None        # tfds data_dir (required for tfds datasets)
    partition: str = "dirichlet"       # one of PARTITIONS
    alpha: float = 0.3                 # Dirichlet concentration
    min_size: int = 10                 # 'dirichlet': minimum examples per client
    replacement: bool = False          # 'dirichlet_balanced': sample with replacement (FedInit)
    classes_per_client: int = 2        # 'classes'
    num_clients: int = 20
    augment: str = "none"              # training batches: one of AUGMENTATIONS ('flip_crop':
                                       #   the FedDyn code's CIFAR flip + pad-4 crop)
    # model
    model: str = "mlp"
    conv_impl: str | None = None       # 'im2col' | 'xla'; default per backend
    # algorithm
    algorithm: str = "fedavg"          # one of ALGORITHMS
    algorithm_args: str = "{}"         # JSON hyperparameters, e.g. '{"alpha": 0.1}' for feddyn
    switch_to: str | None = None       # continue with this algorithm from round switch_at on
    switch_at: int = 0                 # (feddyn-as-initialization: FedDyn, then FedAvg)
    switch_args: str = "{}"            # JSON hyperparameters of switch_to
    switch_carry_state: bool = False   # switch_to continues from the first algorithm's server and
                                       #   client state (same structure: FedDyn -> a FedDyn variant)
    switch_when: str = "{}"            # JSON args of probes.switching_criterion: switch the round
                                       #   after Proposition 1's condition holds (switch_at unused),
                                       #   e.g. '{"zeta": 0.1, "smoothness": "estimate",
                                       #   "optimum": "centralized"}'
    wrappers: str = "{}"               # JSON {wrapper: {args}}, wrappers of WRAPPERS, e.g.
                                       #   '{"relaxed_init": {"beta": 0.1}}' (+RI)
    server_optimizer: str = "sgd"      # any optax optimizer taking learning_rate (sgd, adam, ...)
    server_optimizer_args: str = "{}"  # JSON kwargs for it, e.g. '{"momentum": 0.9}' for FedAvgM
    server_lr: float = 1.0
    lr: float = 0.05                   # local learning rate
    lr_decay: float = 1.0              # per-round local lr decay: lr * lr_decay**t
    momentum: float = 0.0              # local SGD momentum
    weight_decay: float = 0.0
    clip_norm: float | None = None
    aggregation: str = "examples"      # 'examples' | 'uniform'
    # rounds
    rounds: int = 200
    clients_per_round: int = 10        # with participation 'bernoulli': the expected number
    participation: str = "uniform"     # one of PARTICIPATIONS: 'uniform' (clients_per_round
                                       #   distinct clients) or 'bernoulli' (each client joins
                                       #   with probability clients_per_round / num_clients)
    local_steps: int | None = None     # exactly one of local_steps / local_epochs
    local_epochs: int | None = 2
    batch_size: int = 16               # 0 = the whole local dataset
    # personalized evaluation (feddecay.txt section 4): off while user_test_fraction is 0
    new_users: float = 0.0             # share of the clients held out of training (new users)
    user_val_fraction: float = 0.0     # share of each user's examples kept for validation
    user_test_fraction: float = 0.0    # ... and for test (> 0 turns the evaluation on)
    finetune_steps: int = 0            # SGD steps each user fine-tunes before it is scored
    finetune_lr: float = 0.01          # (pFL-Bench FEMNIST: 5 steps at 0.01)
    # probes and accounting
    probes: str = ""                   # comma-separated fljax.probes names, e.g.
                                       #   'pseudo_gradient_diversity,cosine_previous'
    probe_args: str = "{}"             # JSON {probe: {args}}, e.g. '{"interaction_tensor":
                                       #   {"rounds": [50, 100]}}'
    target_accuracy: float | None = None  # results table: rounds, bytes, FLOPs and seconds to it
    # runner
    eval_every: int = 20
    seed: int = 0
    out_dir: str = "runs/digits_fedavg"
    checkpoint_every: int = 20         # rounds between checkpoints (and one at the end)
    keep_checkpoints: int = 3          # how many recent checkpoints to keep
    client_chunk: int | None = None
    num_devices: int = 1

    def validate(self) -> "ExperimentConfig":
        """Raise FljaxError naming the first bad value; return self when all are allowed."""
        positive = dict(num_clients=self.num_clients, clients_per_round=self.clients_per_round,
                        rounds=self.rounds, eval_every=self.eval_every,
                        num_devices=self.num_devices, checkpoint_every=self.checkpoint_every,
                        keep_checkpoints=self.keep_checkpoints)
        for name, value in positive.items():
            if not isinstance(value, int) or value < 1:
                raise FljaxError(f"{name} must be an integer >= 1, got {value!r}")
        if self.lr <= 0:
            raise FljaxError(f"lr must be > 0, got {self.lr}")
        if self.server_lr <= 0:
            raise FljaxError(f"server_lr must be > 0, got {self.server_lr}")
        if not 0 < self.lr_decay <= 1:
            raise FljaxError(f"lr_decay must be in (0, 1], got {self.lr_decay}")
        if self.momentum < 0 or self.momentum >= 1:
            raise FljaxError(f"momentum must be in [0, 1), got {self.momentum}")
        if self.weight_decay < 0:
            raise FljaxError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if self.clip_norm is not None and self.clip_norm <= 0:
            raise FljaxError(f"clip_norm must be > 0 or unset, got {self.clip_norm}")
        if self.min_size < 0:
            raise FljaxError(f"min_size must be >= 0, got {self.min_size}")
        if self.alpha <= 0:
            raise FljaxError(f"alpha must be > 0, got {self.alpha}")
        if self.batch_size < 0:
            raise FljaxError(f"batch_size must be >= 1, or 0 for the full local dataset, got "
                             f"{self.batch_size}")
        for name in ("new_users", "user_val_fraction", "user_test_fraction"):
            if not 0 <= getattr(self, name) < 1:
                raise FljaxError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if self.user_val_fraction + self.user_test_fraction >= 1:
            raise FljaxError(f"user_val_fraction + user_test_fraction must be < 1, got "
                             f"{self.user_val_fraction} + {self.user_test_fraction}")
        if self.user_test_fraction == 0 and (self.new_users or self.user_val_fraction
                                             or self.finetune_steps):
            raise FljaxError("new_users, user_val_fraction and finetune_steps need "
                             "user_test_fraction > 0 (users are scored on their test split), "
                             "got user_test_fraction=0")
        if not isinstance(self.finetune_steps, int) or self.finetune_steps < 0:
            raise FljaxError(f"finetune_steps must be an integer >= 0, got "
                             f"{self.finetune_steps!r}")
        if self.finetune_lr <= 0:
            raise FljaxError(f"finetune_lr must be > 0, got {self.finetune_lr}")
        if self.participation not in PARTICIPATIONS:
            raise FljaxError(f"participation must be one of {PARTICIPATIONS}, got "
                             f"{self.participation!r}")
        if self.augment not in AUGMENTATIONS:
            raise FljaxError(f"augment must be one of {AUGMENTATIONS}, got {self.augment!r}")
        if self.partition not in PARTITIONS:
            raise FljaxError(f"partition must be one of {PARTITIONS}, got {self.partition!r}")
        if self.conv_impl is not None and self.conv_impl not in CONV_IMPLS:
            raise FljaxError(f"conv_impl must be one of {CONV_IMPLS} or unset, got "
                             f"{self.conv_impl!r}")
        if self.model not in MODEL_NAMES:
            raise FljaxError(f"unknown model {self.model!r}; choose one of {MODEL_NAMES}")
        if self.algorithm not in ALGORITHMS:
            raise FljaxError(f"algorithm must be one of {ALGORITHMS}, got {self.algorithm!r}")
        if self.clients_per_round > self.num_clients:
            raise FljaxError(f"clients_per_round ({self.clients_per_round}) must be <= "
                             f"num_clients ({self.num_clients})")
        if (self.local_steps is None) == (self.local_epochs is None):
            raise FljaxError("set exactly one of local_steps and local_epochs, got "
                             f"local_steps={self.local_steps}, local_epochs={self.local_epochs}")
        work = self.local_steps if self.local_steps is not None else self.local_epochs
        if work < 1:
            raise FljaxError(f"local_steps / local_epochs must be >= 1, got {work}")
        if self.switch_to is not None and self.switch_to not in ALGORITHMS:
            raise FljaxError(f"switch_to must be one of {ALGORITHMS}, got {self.switch_to!r}")
        if self.switch_at < 0:
            raise FljaxError(f"switch_at must be >= 0, got {self.switch_at}")
        for name in ("server_optimizer_args", "algorithm_args", "switch_args", "wrappers",
                     "probe_args", "switch_when"):
            json_object(name, getattr(self, name))
        if json_object("switch_when", self.switch_when) and (self.switch_to is None
                                                             or self.switch_at != 0):
            raise FljaxError(f"switch_when needs switch_to (the second algorithm) and no "
                             f"switch_at, got switch_to={self.switch_to!r}, "
                             f"switch_at={self.switch_at}")
        from fljax.probes import PROBES
        unknown = sorted(set(self.probe_names()) - set(PROBES))
        if unknown:
            raise FljaxError(f"unknown probe(s) {unknown}; allowed: {sorted(PROBES)}")
        unused = sorted(set(json_object("probe_args", self.probe_args)) - set(self.probe_names()))
        if unused:
            raise FljaxError(f"probe_args names {unused}, which are not in probes "
                             f"{self.probe_names()}")
        if self.target_accuracy is not None and not 0 < self.target_accuracy <= 1:
            raise FljaxError(f"target_accuracy must be in (0, 1] or unset, got "
                             f"{self.target_accuracy}")
        unknown = sorted(set(json_object("wrappers", self.wrappers)) - set(WRAPPERS))
        if unknown:
            raise FljaxError(f"unknown wrapper(s) {unknown}; allowed: {list(WRAPPERS)}")
        server_optimizer_factory(self.server_optimizer)
        return self

    def probe_names(self) -> list[str]:
        """The names in ``probes``, in order."""
        return [name.strip() for name in self.probes.split(",") if name.strip()]

    def replace(self, **changes) -> "ExperimentConfig":
        """A copy with ``changes``, each checked against the field's type."""
        fields = {f.name: f.type for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - set(fields))
        if unknown:
            raise FljaxError(f"unknown config key(s) {unknown}; allowed: {sorted(fields)}")
        for name, value in changes.items():
            changes[name] = _coerce(name, fields[name], value)
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def json_object(name: str, text: str) -> dict[str, Any]:
    """Parse a config field holding a JSON object of keyword arguments."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise FljaxError(f"{name} must be a JSON object, got {text!r} ({e.msg})") from None
    if not isinstance(value, dict):
        raise FljaxError(f"{name} must be a JSON object, got {text!r}")
    return value


def _coerce(name: str, annotation: str, value: Any) -> Any:
    """Check ``value`` against a field annotation such as 'float | None'; ints pass as floats,
    a dict passes as its JSON text for the ``*_args`` and ``wrappers`` fields."""
    allowed = [t.strip() for t in annotation.split("|")]
    if value is None and "None" in allowed:
        return None
    if "bool" in allowed and isinstance(value, bool):
        return value
    if "int" in allowed and isinstance(value, int) and not isinstance(value, bool):
        return value
    if "float" in allowed and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if "str" in allowed and isinstance(value, str):
        return value
    if name == "probes" and isinstance(value, list) and all(isinstance(v, str) for v in value):
        return ",".join(value)
    if (name.endswith("_args") or name == "wrappers") and isinstance(value, dict):  # JSON object
        return json.dumps(value)
    raise FljaxError(f"{name} must be of type {annotation}, got {value!r}")


def server_optimizer_factory(name: str):
    """The optax optimizer called ``name`` (big_vision style: by attribute, no registry)."""
    factory = getattr(optax, name, None)
    if not callable(factory) or name.startswith("_") or name in ("chain", "tree"):
        raise FljaxError(f"unknown server optimizer {name!r}; use an optax optimizer name such "
                         f"as 'sgd', 'adam', 'yogi', 'adagrad'")
    return factory


def load_config(path: str, **overrides) -> ExperimentConfig:
    """Read a JSON config file (keys are ExperimentConfig fields), then apply ``overrides``."""
    if not os.path.isfile(path):
        raise FljaxError(f"config file {path!r} does not exist")
    try:
        with open(path) as f:
            values = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise FljaxError(f"config file {path!r} is not valid JSON: {e}") from None
    if not isinstance(values, dict):
        raise FljaxError(f"config file {path!r} must hold a JSON object, got "
                         f"{type(values).__name__}")
    return ExperimentConfig().replace(**{**values, **overrides})
