"""Keyword arguments read from JSON (``--algorithm-args``, ``--wrappers``, ...), checked against
the signature of the factory they are for: a name it does not take, a required one missing, a
value of the wrong type, a NaN or an infinity is a one-line FljaxError naming it.

Which arguments a user sets is read from each factory's signature: its parameters after the
leading ones the experiment supplies (the local optimizer, the wrapped algorithm), except those the
experiment fills in itself (``FILLED``).
"""

from __future__ import annotations

import inspect
import json
import math
import types
import typing
from typing import Callable

from fljax.errors import FljaxError

# What the experiment fills in rather than the JSON arguments: besides a factory's first argument
# (the local optimizer, the learning rate, or the wrapped algorithm), these arguments, and
# lbsgd's SGD flags.
FILLED = ("model", "server_lr", "server_optimizer", "name", "cohort_size")
LBSGD_FLAGS = ("weight_decay", "momentum", "clip_norm")
# gradual_unfreezing takes units of parameter groups; the experiment builds them from this one.
UNIT = inspect.Parameter("unit", inspect.Parameter.KEYWORD_ONLY, default="M", annotation="str")
# Leading arguments the experiment supplies, where more than one: FedBN's parameter shapes.
LEADING = {"fedbn": 2}
# The JSON values a type named in an annotation admits.
# StaticFloat: a number that sets a shape (top-k's share of coordinates): structure, not traced.
JSON_TYPES = {"float": (int, float), "StaticFloat": (int, float), "int": (int,), "bool": (bool,),
              "Sequence[int]": (list,),
              "str": (str,), "None": (type(None),), "NoneType": (type(None),)}


def settable(name: str, factory: Callable) -> list[inspect.Parameter]:
    """The arguments of ``factory`` (algorithm or wrapper ``name``) that one sets in JSON: its
    parameters after the leading ones the experiment supplies (the local optimizer, the
    learning rate or the wrapped algorithm; LEADING), without FILLED (a required one has no
    default)."""
    parameters = list(inspect.signature(factory).parameters.values())[LEADING.get(name, 1):]
    if name == "gradual_unfreezing":
        parameters = [UNIT, *parameters[1:]]
    filled = FILLED + (LBSGD_FLAGS if name == "lbsgd" else ())
    return [p for p in parameters if p.name not in filled and p.kind != p.VAR_KEYWORD]


def check_kwargs(what: str, parameters: list[inspect.Parameter], kwargs: dict,
                 supplied: tuple[str, ...] = ()) -> None:
    """Raise FljaxError unless ``kwargs`` (from JSON) suit ``parameters``: every name known, every
    required one given (or ``supplied`` by the experiment), every value of its type."""
    allowed = [p.name for p in parameters if p.name not in ("name", "model")]
    unknown = sorted(kwargs.keys() - set(allowed))
    missing = [p.name for p in parameters if p.default is p.empty
               and p.name not in kwargs and p.name not in supplied]
    if unknown or missing:
        problem = f"does not take {unknown}" if unknown else f"needs {missing} in its arguments"
        raise FljaxError(f"{what} {problem}; its hyperparameters are {allowed}")
    for parameter in parameters:
        if parameter.name in kwargs:
            check_value(what, parameter, kwargs[parameter.name])


def check_value(what: str, parameter: inspect.Parameter, value) -> None:
    """Raise FljaxError unless ``value`` (read from JSON) suits ``parameter``: its type is one the
    annotation names (bool, int, float, str, None; ints pass as floats; true is no number), or
    that of its default when the annotation names none of them; a float must be finite.
    Annotations naming ``Any``, or no such type and no such default, admit any value, and so does
    a check of a value JSON cannot hold (the experiment supplied it, e.g. an array)."""
    if not isinstance(value, (bool, int, float, str, type(None), list, dict)):
        return   # not from JSON: supplied by the experiment (e.g. an array)
    kinds = json_kinds(parameter)
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


def json_kinds(parameter: inspect.Parameter) -> set[type]:
    """The Python types of the JSON values ``parameter`` admits (empty: any)."""
    names = [] if parameter.annotation is parameter.empty else alternatives(parameter.annotation)
    kinds = {t for n in names for t in JSON_TYPES.get(n, ())}
    if "Any" in names:
        return set()
    if not kinds and type(parameter.default) in (bool, int, float, str):
        kinds = set(JSON_TYPES[type(parameter.default).__name__])
    if int in kinds:
        kinds.discard(bool)   # array-like annotations name bool too; a JSON true is no number
    return kinds


def takes_float(parameter: inspect.Parameter) -> bool:
    """Whether ``parameter`` takes a real number that changes no shape (a float or a scalar of
    optax's ``ScalarOrSchedule``): a hyperparameter that can be traced (``fljax.hyperparams``)."""
    if parameter.annotation is parameter.empty:
        return isinstance(parameter.default, float)
    names = alternatives(parameter.annotation)
    return any(n in ("float", "jax.typing.ArrayLike") or "Scalar" in n for n in names)


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
