"""Names of algorithms, wrappers, models, datasets and probes: fljax's own and the user's.

Every tool that takes a name (``--algorithm``, ``--model``, ``--dataset``, ``--probes``, config and
sweep files, ``--set`` grids, ``fljax.build``, ``run_grid``, batched runs) looks it up here, so a
user's own piece enters all of them without an edit to fljax, in one of two ways:

- by import path, ``"package.module:attribute"`` (``--algorithm mylab.methods:fedfoo``): the
  module is imported (from the current directory too, as ``python -m`` would) and the attribute
  is the factory; nothing to register, and a resumed run finds it again by the same path;
- by name, after ``fljax.register_algorithm("fedfoo", fedfoo)`` (``register_model``,
  ``register_dataset``, ``register_probe``) in a notebook or at a package's import.

A run directory records where each registered name came from (``recorded_paths``, in its
``config.json`` and checkpoints as ``"imports"``), so a resume imports it again before the name
is looked up (``import_recorded``).

What a factory of each kind is called with:

- algorithm: ``factory(local, **algorithm_args)`` as the built-ins, ``local`` the config's local
  optimizer (``fljax.local_sgd(lr, momentum=..., weight_decay=..., clip_norm=..., ...)``), plus
  ``model``, ``server_lr`` or ``server_optimizer`` if it names them; its keyword arguments are
  its ``--algorithm-args``, checked against its signature (``fljax.runner.arguments``), and those that
  take a ``float`` may be traced, so a grid over them is one compiled program;
- model: ``factory(num_classes=..., input_shape=...)`` (the ones it names) returning a Flax module
  (wrapped by ``fljax.from_module``) or a ``fljax.Model``;
- dataset: ``loader(data_dir=..., num_clients=..., seed=...)`` (the ones it names) returning a
  ``fljax.data.Dataset``;
- probe: ``factory(**probe_args)`` returning a ``fljax.probes.Probe``.

This module imports nothing of fljax but its errors: the built-ins are import paths until used.
"""

from __future__ import annotations

import difflib
import importlib
import os
import re
import sys
from typing import Any, Callable

from fljax.errors import FljaxError

KINDS = ("algorithm", "wrapper", "model", "dataset", "probe")
# fljax's own, in the order `fljax algorithms` lists them; each is fljax.algorithms.NAME.
BUILTIN_ALGORITHMS = ("fedavg", "fedsgd", "fedprox", "scaffold", "feddyn", "fedavgm", "fedadam",
                      "fedyogi", "fedadagrad", "fedexp", "fednova", "fedcm", "fedsam", "moon",
                      "fedntd", "feddecorr", "fedinit", "fedga", "gradalign", "lbsgd", "feddecay",
                      "fomaml", "reptile", "ditto", "pfedme", "fedem", "fedpaq")
# Wrappers over any algorithm, applied innermost first (fljax.runner.experiment.wrap).
BUILTIN_WRAPPERS = ("gradual_unfreezing", "local_decay", "relaxed_init", "fedbn", "robust",
                    "byzantine", "compress", "dp")
BUILTIN_PROBES = ("pseudo_gradient_diversity", "cosine_previous", "cosine_to", "state_diversity",
                  "gradient_dissimilarity", "train_evaluation", "all_model", "divergence",
                  "interaction_tensor", "switching_criterion")
_BUILTIN = {"algorithm": ("fljax.algorithms", BUILTIN_ALGORITHMS),
            "wrapper": ("fljax.algorithms", BUILTIN_WRAPPERS),
            "probe": ("fljax.probes", BUILTIN_PROBES)}
# Settings an algorithm may declare as its paper's (``declare``): used where the user sets none.
SETTINGS = ("aggregation",)
_IMPORT_PATH = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")

_registered: dict[str, dict[str, Callable]] = {kind: {} for kind in KINDS}


def is_import_path(name: str) -> bool:
    """Whether ``name`` reads as ``module:attribute`` (a tfds name such as 'cifar10:3.0.2' does
    not: its attribute is no identifier)."""
    return bool(_IMPORT_PATH.fullmatch(name))


def register(kind: str, name: str, factory: Callable) -> Callable:
    """Make ``factory`` the ``kind`` called ``name`` in every fljax tool; returns ``factory``.

    Registering the same factory again is a no-op; another one under a taken name (a built-in or
    an earlier registration) is an error: unregister it first."""
    if kind not in KINDS:
        raise FljaxError(f"unknown kind {kind!r}; one of {list(KINDS)}")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][\w.-]*", name):
        raise FljaxError(f"a {kind} name must be letters, digits, '_', '.' or '-' (not starting "
                         f"with a digit), got {name!r}")
    if not callable(factory):
        raise FljaxError(f"{kind} {name!r}: the factory must be callable, got {factory!r}")
    taken = _registered[kind].get(name)
    if taken is not None and taken is not factory:
        raise FljaxError(f"{kind} {name!r} is registered already (to {path_of(taken)}); "
                         f"fljax.unregister({kind!r}, {name!r}) first to replace it")
    if name in builtin_names(kind):
        raise FljaxError(f"{kind} {name!r} is one of fljax's own; choose another name")
    _registered[kind][name] = factory
    return factory


def unregister(kind: str, name: str) -> None:
    """Forget a registered ``kind`` ``name`` (nothing if it is not registered)."""
    _registered[kind].pop(name, None)


def register_algorithm(name: str, factory: Callable, **settings) -> Callable:
    """Register an algorithm factory ``factory(local, **hyperparameters) -> fljax.Algorithm``
    under ``name``; ``settings`` (e.g. ``aggregation="uniform"``) are its paper's
    (``declare``)."""
    if settings:
        declare(**settings)(factory)
    return register("algorithm", name, factory)


def register_model(name: str, factory: Callable) -> Callable:
    """Register a model factory ``factory(num_classes=..., input_shape=...)`` (the arguments it
    names) returning a Flax module or a ``fljax.Model``."""
    return register("model", name, factory)


def register_dataset(name: str, loader: Callable) -> Callable:
    """Register a dataset loader ``loader(data_dir=..., num_clients=..., seed=...)`` (the
    arguments it names) returning a ``fljax.data.Dataset``."""
    return register("dataset", name, loader)


def register_probe(name: str, factory: Callable) -> Callable:
    """Register a probe factory ``factory(**probe_args) -> fljax.probes.Probe``."""
    return register("probe", name, factory)


def declare(**settings) -> Callable[[Callable], Callable]:
    """Decorator: the settings an algorithm's paper or official code uses where the engine has a
    choice, applied when the user sets none (``ExperimentConfig.resolved``). Allowed:
    ``aggregation`` ('examples' or 'uniform')."""
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        raise FljaxError(f"an algorithm declares only {list(SETTINGS)}, got {unknown}")

    def mark(factory: Callable) -> Callable:
        factory.fljax_settings = {**getattr(factory, "fljax_settings", {}), **settings}
        return factory

    return mark


def declared(factory: Callable) -> dict[str, Any]:
    """The settings ``factory`` declares as its paper's ({} if none)."""
    return dict(getattr(factory, "fljax_settings", {}))


def builtin_names(kind: str) -> tuple[str, ...]:
    """fljax's own names of ``kind`` that this registry holds (algorithms, wrappers, probes;
    models and datasets have their own name rules: ``fljax.models``, ``fljax.data``)."""
    return _BUILTIN.get(kind, ("", ()))[1]


def names(kind: str) -> tuple[str, ...]:
    """Every name of ``kind`` known now: the built-ins, then the registered ones."""
    return builtin_names(kind) + tuple(n for n in _registered[kind] if n not in
                                       builtin_names(kind))


def registered(kind: str, name: str) -> bool:
    """Whether ``name`` is a user's ``kind``: registered, or an import path."""
    return name in _registered[kind] or is_import_path(name)


def lookup(kind: str, name: str, known: tuple[str, ...] = ()) -> Callable:
    """The factory of ``kind`` ``name``: a built-in, a registered name or an import path.
    Anything else is a one-line FljaxError with the nearest known names (``known``: more names
    that are valid for this kind, e.g. the built-in models)."""
    if name in _registered[kind]:
        return _registered[kind][name]
    if name in builtin_names(kind):
        return getattr(importlib.import_module(_BUILTIN[kind][0]), name)
    if isinstance(name, str) and is_import_path(name):
        return import_path(name, kind)
    raise FljaxError(unknown_message(kind, name, names(kind) + tuple(known)))


def closest(name: Any, choices: tuple[str, ...]) -> str:
    """'did you mean 'X'? ' for the choices nearest ``name`` (case aside), or ''."""
    by_lower = {c.lower(): c for c in choices}
    close = difflib.get_close_matches(str(name).lower(), list(by_lower), n=3, cutoff=0.6)
    return f"did you mean {' or '.join(repr(by_lower[c]) for c in close)}? " if close else ""


def unknown_message(kind: str, name: Any, choices: tuple[str, ...]) -> str:
    """'unknown KIND NAME; did you mean X?' with the choices, and the two ways to add one."""
    return (f"unknown {kind} {name!r}; {closest(name, choices)}choose one of {list(choices)}, "
            f"an import path 'module:{kind}' or a name given to fljax.register_{kind}")


def import_path(path: str, kind: str = "object") -> Any:
    """The object at ``'package.module:attribute'`` (attribute may be dotted), importing the
    module; the current directory is searched too. A one-line FljaxError if it cannot be had."""
    module_name, attribute = path.split(":", 1)
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())
    try:
        value = importlib.import_module(module_name)
    except ImportError as e:
        raise FljaxError(f"{kind} {path!r}: module {module_name!r} cannot be imported ({e})") \
            from None
    for part in attribute.split("."):
        if not hasattr(value, part):
            raise FljaxError(f"{kind} {path!r}: module {module_name!r} has no attribute "
                             f"{attribute!r}")
        value = getattr(value, part)
    if not callable(value):
        raise FljaxError(f"{kind} {path!r} is not callable (a {type(value).__name__})")
    return value


def path_of(factory: Callable) -> str:
    """``factory``'s import path, 'module:qualified.name'."""
    return f"{factory.__module__}:{factory.__qualname__}"


def importable_path(factory: Callable, kind: str = "algorithm") -> str:
    """The name ``factory`` is registered under as a ``kind``, else its import path
    (``path_of``); a one-line FljaxError when neither finds it again (a function defined inside
    another)."""
    for name, registered_factory in _registered[kind].items():
        if registered_factory is factory:
            return name
    path = path_of(factory)
    try:
        found = import_path(path, kind)
    except FljaxError:
        found = None
    if found is not factory:
        raise FljaxError(f"{kind} {getattr(factory, '__name__', factory)!r} cannot be found "
                         f"again by its import path {path!r}: register it "
                         f"(fljax.register_{kind}(name, factory)) and use its name")
    return path


def recorded_paths(used: dict[str, list[str]]) -> dict[str, dict[str, str]]:
    """{kind: {name: import path}} of the registered (not built-in, not import-path) names in
    ``used`` ({kind: names}): what a run directory records so that a resume finds them again."""
    result: dict[str, dict[str, str]] = {}
    for kind, used_names in used.items():
        for name in used_names:
            if name in _registered[kind]:
                result.setdefault(kind, {})[name] = path_of(_registered[kind][name])
    return result


def import_recorded(paths: dict[str, dict[str, str]]) -> None:
    """Register again the names a run directory recorded (``recorded_paths``) that are not
    registered in this process: their factories imported from their paths. A name registered
    here already keeps its factory."""
    for kind, by_name in (paths or {}).items():
        for name, path in by_name.items():
            if kind in KINDS and name not in _registered[kind]:
                _registered[kind][name] = import_path(path, kind)
