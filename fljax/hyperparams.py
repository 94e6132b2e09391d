"""Hyperparameters that may be traced: a Python number, or a scalar array that may be a tracer.

Every hyperparameter that does not change a shape (learning rates and their decays, momentum,
weight decay, clip norm, the server's numbers, an algorithm's own mu, alpha, beta, ...) can be
given to its factory as a scalar array instead of a Python number. Inside a jitted or vmapped
function the array is a tracer, so one compiled program serves every value: a grid of learning
rates, or R runs with their own values side by side (``fljax.make_round(..., runs=R)``).

A factory checks a concrete value at once, with the same one-line error as for a Python number;
a traced value cannot be read while the program is traced, so it is checked where it was still
concrete (the batched round checks each run's values on the host before training).
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Callable

import jax
import numpy as np

from fljax.errors import FljaxError


def is_traced(value: Any) -> bool:
    """Whether ``value`` is a tracer (an abstract value inside jit, vmap or grad)."""
    return isinstance(value, jax.core.Tracer)


def is_number(value: Any) -> bool:
    """A real number: a Python int or float (not a bool), or a scalar numpy or jax array of an
    integer or floating dtype (traced or not)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, numbers.Real):
        return True
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    return (shape == () and dtype is not None and dtype != np.bool_
            and (np.issubdtype(dtype, np.integer) or np.issubdtype(dtype, np.floating)))


def concrete(value: Any) -> float | int | None:
    """The Python number of a concrete hyperparameter; None for a traced one."""
    if is_traced(value):
        return None
    if isinstance(value, numbers.Integral) or (hasattr(value, "dtype")
                                               and np.issubdtype(value.dtype, np.integer)):
        return int(value)
    return float(value)


def check(name: str, value: Any, ok: Callable[[float], bool], allowed: str) -> None:
    """Raise FljaxError ``"NAME must be ALLOWED, got VALUE"`` unless ``value`` is a number for
    which ``ok`` holds (a NaN or an infinity never does unless ``ok`` says so); a traced value
    passes."""
    if not is_number(value):
        raise FljaxError(f"{name} must be {allowed}, got {value!r}")
    number = concrete(value)
    if number is not None and not ok(number):
        raise FljaxError(f"{name} must be {allowed}, got {shown(value)}")


def finite(test: Callable[[float], bool]) -> Callable[[float], bool]:
    """``test`` for finite numbers only."""
    return lambda v: math.isfinite(v) and test(v)


POSITIVE = finite(lambda v: v > 0)         # check(name, value, POSITIVE, "> 0 and finite")
NON_NEGATIVE = finite(lambda v: v >= 0)    # check(name, value, NON_NEGATIVE, ">= 0 and finite")


def shown(value: Any, spec: str = "") -> str:
    """A hyperparameter as messages and names show it: formatted by ``spec`` if given, else a
    Python number as Python writes it and an array's value with ``g``; 'traced' for a tracer."""
    if is_traced(value):
        return "traced"
    if not is_number(value):
        return repr(value)
    number = concrete(value)
    if spec:
        return format(number, spec)
    return repr(value) if isinstance(value, numbers.Real) else format(number, "g")


def is_value(value: Any, number: float) -> bool:
    """Whether ``value`` is concretely equal to ``number`` (never for a traced value): for the
    shortcuts a factory takes at a special value (FedDecay's beta = 1 is FedAvg bit for bit)."""
    return is_number(value) and concrete(value) == number
