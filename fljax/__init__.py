"""fljax: federated-learning research in JAX, one compiled XLA program per communication round.

Every algorithm and wrapper is a top-level name, as optax exposes its transforms::

    import fljax
    algorithm = fljax.feddyn(fljax.local_sgd(0.1), alpha=0.01)
    algorithm = fljax.switch(algorithm, fljax.fedavg(fljax.local_sgd(0.1)), at_round=150)
    round_fn = fljax.make_round(algorithm, model, data, clients_per_round=10, batch_size=50,
                                local_epochs=5)

Your own algorithm, model, dataset or probe enters every tool (the CLI, config and sweep files,
grids, batched runs) by import path (``--algorithm mylab.methods:fedfoo``) or by name after
``fljax.register_algorithm("fedfoo", fedfoo)`` (``help(fljax.registry)``).

``help(fljax.Algorithm)`` explains the algorithm interface (write your own in a few lines),
``help(fljax.make_round)`` the round, ``help(fljax.probes)`` the in-round measurements.
"""

import importlib

from fljax.registry import BUILTIN_ALGORITHMS, BUILTIN_WRAPPERS

__version__ = "0.1.0"

ALGORITHM_NAMES = sorted(BUILTIN_ALGORITHMS)
WRAPPER_NAMES = sorted([*BUILTIN_WRAPPERS, "local_layers", "switch"])

# Where each public name lives. They are imported on first use (PEP 562), so ``import fljax`` and
# the CLI start in milliseconds and Ctrl-C during the heavy imports (jax, orbax) is the CLI's.
_HOMES = {
    "fljax.algorithms": ["Algorithm", "ClientContext", "LocalSGD", "local_sgd", *ALGORITHM_NAMES,
                         *WRAPPER_NAMES],
    "fljax.runner.config": ["ExperimentConfig", "load_config"],
    "fljax.data": ["FederatedData", "federate", "load_dataset"],
    "fljax.core.engine": ["RoundFunction", "RoundState", "init_state", "make_round", "sample_cohort"],
    "fljax.errors": ["FljaxError"],
    "fljax.models.evaluate": ["make_evaluator"],
    "fljax.runner.experiment": ["Experiment", "build"],
    "fljax.models": ["Model", "from_module", "make_model", "mixture"],
    "fljax.registry": ["declare", "register_algorithm", "register_dataset", "register_model",
                       "register_probe", "unregister"],
    "fljax.runner.sweep": ["grid_table", "run_grid"],
    "fljax.runner.train": ["results_table", "run", "run_many"],
}
_HOME = {name: module for module, names in _HOMES.items() for name in names}
# Modules reachable as attributes (``fljax.sweep``), with where they live in the layers below.
_SUBMODULES = {
    "accounting": "fljax.accounting", "algorithms": "fljax.algorithms",
    "compression": "fljax.compression", "core": "fljax.core", "data": "fljax.data",
    "experiment": "fljax.runner.experiment", "hyperparams": "fljax.hyperparams",
    "models": "fljax.models", "population": "fljax.population", "privacy": "fljax.privacy",
    "probes": "fljax.probes", "registry": "fljax.registry", "robustness": "fljax.robustness",
    "runner": "fljax.runner", "runs": "fljax.core.runs", "sweep": "fljax.runner.sweep",
    "train": "fljax.runner.train",
}

__all__ = sorted(_HOME) + ["probes"]


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(_SUBMODULES[name])
    if name not in _HOME:
        raise AttributeError(f"module 'fljax' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(__all__) | set(globals()))
