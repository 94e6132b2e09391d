"""Which runs of a table can share one compiled program (``fljax.make_round(..., runs=R)``).

Two experiments compile to the same round program when they differ only in

- values that are *traced* (``fljax.hyperparams``): the local optimizer's numbers (``lr``,
  ``lr_decay``, ``momentum``, ``weight_decay``, a set ``clip_norm``), ``server_lr``, a set
  ``switch_at`` and ``switch_lr``, and every number of the algorithm's, the switch's, a wrapper's or the server
  optimizer's JSON arguments whose factory parameter takes a float (FedProx's mu, FedDyn's
  alpha, +RI's beta, FedBug's unfreezing share, ...);
- their *data*: the seed (the split, the initial model, every draw) and the split's settings
  (``partition``, ``dirichlet_alpha``, ...): each run trains on its own split;
- how they are *run*: rounds, evaluation and checkpoint intervals, output directory.

Everything else (the algorithm, the model, the dataset, the number of clients, local work,
shapes, a value that is None in one and a number in another) is the program's structure.
"""

from __future__ import annotations

import inspect
import json
from typing import Any, Sequence

import optax

from fljax import registry
from fljax.runner.arguments import takes_float
from fljax.runner.config import ExperimentConfig, resolved_values

TRACED_FIELDS = ("lr", "lr_decay", "momentum", "weight_decay", "clip_norm", "server_lr",
                 "switch_at", "switch_lr")
DATA_FIELDS = ("seed", "partition", "dirichlet_alpha", "min_size", "replacement",
               "classes_per_client", "validation_fraction", "user_val_fraction",
               "user_test_fraction")
RUN_FIELDS = ("rounds", "eval_every", "checkpoint_every", "keep_checkpoints", "out_dir",
              "target_accuracy", "target_epsilon", "dp_delta", "accountant")
# (target_epsilon sets the dp wrapper's noise_multiplier, a traced value; delta and the
#  accountant are the host's accounting)


def values(config: ExperimentConfig) -> dict[str, Any]:
    """Every value of ``config`` by key: its fields, and each argument of its JSON-valued fields
    under a dotted key (``algorithm_args.mu``, ``wrappers.relaxed_init.beta``)."""
    options = config.options
    flat = {k: v for k, v in resolved_values(config.to_dict()).items()
            if k not in ("algorithm_args", "switch_args", "wrappers", "server_optimizer_args")}
    for field, args in (("algorithm_args", options.algorithm_args),
                        ("switch_args", options.switch_args),
                        ("server_optimizer_args", options.server_optimizer_args)):
        flat.update({f"{field}.{k}": v for k, v in args.items()})
        flat[field] = sorted(args)                      # the names given are structure
    for wrapper, args in config.wrapper_args.items():
        flat.update({f"wrappers.{wrapper}.{k}": v for k, v in args.items()})
        flat[f"wrappers.{wrapper}"] = sorted(args)
    return flat


def traceable(config: ExperimentConfig, key: str) -> bool:
    """Whether ``key``'s value (a number here) can be a traced hyperparameter of ``config``."""
    value = values(config).get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if key in TRACED_FIELDS:
        return not key.startswith("switch_") or config.switch_to is not None
    field, *path = key.split(".")
    if not path or field not in ("algorithm_args", "switch_args", "server_optimizer_args",
                                 "wrappers") or (field == "wrappers" and len(path) != 2) or (
            field == "switch_args" and config.switch_to is None):
        return False
    factory = {"algorithm_args": lambda: registry.lookup("algorithm", config.algorithm),
               "switch_args": lambda: registry.lookup("algorithm", config.switch_to),
               "server_optimizer_args": lambda: getattr(optax, config.server_optimizer),
               "wrappers": lambda: registry.lookup("wrapper", path[0])}[field]()
    parameter = inspect.signature(factory).parameters.get(path[-1])
    return parameter is not None and takes_float(parameter)


def batchable(config: ExperimentConfig) -> bool:
    """Whether runs of ``config`` can share a program with others: not with an adaptive switch or
    the switching-criterion probe (their constants come from one run's data and initial model),
    nor with FedInit's noise (each run's images are its own), nor with a population sharded over
    devices or processes."""
    return (not config.options.switch_when and "switching_criterion" not in config.options.probes
            and config.client_noise == 0 and config.class_noise == 0
            and config.num_devices == 1 and config.num_processes == 1)


def structure(config: ExperimentConfig) -> str:
    """The program ``config`` compiles to, as a key: equal keys, one program (traced values, data
    and run settings aside). A config that is not ``batchable`` has a key of its own."""
    if not batchable(config):
        return json.dumps(values(config), sort_keys=True, default=str)
    return program_key(config)


def program_key(config: ExperimentConfig) -> str:
    """The program ``config``'s round compiles to, batchable or not: its values less the traced,
    data and run ones (equal keys: programs of equal shapes and operations)."""
    skipped = set(RUN_FIELDS) | set(DATA_FIELDS)
    key = {}
    for name, value in values(config).items():
        if name in skipped:
            continue
        if traceable(config, name):
            value = "<traced>"
        key[name] = value
    return json.dumps(key, sort_keys=True, default=str)


def traced_keys(configs: Sequence[ExperimentConfig]) -> list[str]:
    """The traceable keys whose values differ between ``configs`` (of one structure)."""
    first = values(configs[0])
    rows = [values(c) for c in configs[1:]]
    return sorted(k for k, v in first.items()
                  if any(row.get(k) != v for row in rows) and traceable(configs[0], k))


def group(configs: Sequence[ExperimentConfig], most: int) -> list[list[int]]:
    """The indices of ``configs`` in groups that share a program, each of at most ``most`` runs,
    in the order of their first member."""
    by_structure: dict[str, list[int]] = {}
    for i, config in enumerate(configs):
        by_structure.setdefault(structure(config), []).append(i)
    groups = []
    for members in by_structure.values():
        groups += [members[i:i + most] for i in range(0, len(members), most)]
    return sorted(groups, key=lambda g: g[0])
