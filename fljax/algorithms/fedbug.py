"""FedBug: bottom-up gradual unfreezing of the local model, over any federated algorithm.

Kao & Wang, "FedBug: A Bottom-Up Gradual Unfreezing Framework for Federated Learning",
arXiv:2307.10317, 2023; official code ``IandRover/FedBug`` (``utils_gu.py:StopGradScheduler``, run
before every local step).

Paper (Algorithms 1 and 3). The model has M modules theta^1..theta^M, input to output; a client
takes K local steps, the first P*K of them the gradual-unfreezing (GU) stage. At local step
k = 1..K only the first m modules are updated:

    m = min{M, ceil(k M / (P K))},      theta^{1:m} <- theta^{1:m} - eta_l grad F_i(theta^{1:m}).

Official code (implemented here). With k = 0, 1, ..., K-1 the steps already taken and

    f = P * K // M                         (Python float floor division, as the code computes it)

unit 0 is always trainable and unit j >= 1 is frozen while k < j * f, so the number of trainable
units is min(M, floor(k / f) + 1). In the paper's 1-based count (k+1) unit j trains once
(k+1) M / (P K) > j, i.e. once k >= j P K / M (rounded up to an integer); the two agree whenever
P K / M is an integer. Otherwise the code unfreezes earlier: it floors P K / M before multiplying
by j. P = 0, and any P K < M (f = 0), freezes nothing: the wrapped algorithm exactly.
K is the client's own step count (``ctx.num_steps``; E * ceil(n_i / B) with local epochs).
f is looked up in a table built on the host in Python floats for every K up to ``ctx.max_steps``,
because in float32 P*K can fall below an integer that float64 reaches (0.53 * 100 -> 52.999996 vs
53.0). A traced P (one program for many fractions) computes f in P's dtype instead: exactly the
table's value in float64; in float32 it can differ from it by one (``unfreeze_factor``).

Ablations (FedBug (Kao and Wang, 2023) appendix, "Comparative Analysis of Freezing Strategies";
``utils_gu.py`` GU codes 200, 301, 302): ``order="top_down"`` mirrors the schedule (the output unit
always trains, the input unit is the last to thaw); ``frozen_last=n`` keeps the last n units frozen
for the whole round (n = 1 is FedBABU's fixed head), with ``fraction=0``.

Freezing, as torch does it. A frozen parameter has no ``.grad``, so torch SGD skips it entirely:
no weight decay, no momentum, no FedDyn/SCAFFOLD linear term, and ``clip_grad_norm_`` leaves it out
of the global norm. Here, per local step and for the wrapped algorithm's optax chain tx:

    g      <- g masked to 0 on frozen leaves     (the clip norm sees only the trainable gradients)
    u, s'  =  tx.update(g, s, y, frozen=mask)    (LocalSGD's chain zeros the in-loss terms of
                                                  frozen leaves before its clip: FedDyn's
                                                  alpha_k (h_k - theta), SCAFFOLD's c - c_i)
    u      <- u masked to 0 on frozen leaves     (no weight decay, linear term, proximal term, ...)
    s'     <- s on frozen leaves, for every params-shaped part of the state (momentum buffers)

so a frozen leaf stays bit-identical to the server's value, and its momentum buffer starts at its
first trainable step with buf = d_p, as torch's does. The mask reaches the clip through optax's
extra arguments, which ``optax.chain`` forwards; a custom local transformation that does not
forward them still has its in-loss terms of frozen leaves in its clip norm.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fljax.algorithms.base import Algorithm, ClientContext, Params
from fljax.algorithms.transforms import frozen_update
from fljax.errors import FljaxError
from fljax.hyperparams import check, is_traced, is_value, shown

ORDERS = ("bottom_up", "top_down")


def unfreeze_factor(fraction: float | jax.Array, num_steps: jax.Array, num_units: int,
                    max_steps: int) -> jax.Array:
    """f = fraction * K // M with Python float semantics, for a traced K in [0, max_steps].

    A concrete fraction: a table of f over K, built in Python floats. A traced fraction: computed
    in its dtype by jnp's float floor division, which follows CPython's (fmod, then the quotient
    of the exact multiple of M), so in float64 f equals the table's int(fraction * k // M) for
    the same fraction: K converts exactly and both round the one product fraction * K the same
    way. In float32 the fraction and the product are rounded to 24 bits, so where fraction * K / M
    is within that rounding of an integer f can differ by one from the float64 table (M = 1,
    K = 100: 52 for P = 0.53 and 29 for P = 0.29 in float32, 53 and 28 in the table); where
    fraction * K is a float32 number (fractions j / 64, K < 2**18) the two agree.
    """
    if not is_traced(fraction):
        table = np.array([int(fraction * k // num_units) for k in range(max_steps + 1)],
                         np.int32)
        return jnp.asarray(table)[num_steps]
    return (fraction * num_steps.astype(fraction.dtype) // num_units).astype(jnp.int32)


def trainable_units(step: jax.Array, factor: jax.Array, num_units: int, order: str,
                    frozen_last: int) -> jax.Array:
    """shape=(M,), bool: which units local step ``step`` (0-based) updates."""
    if frozen_last:
        return jnp.arange(num_units) < num_units - frozen_last
    thaw_rank = jnp.arange(num_units)          # unit j thaws after j * f steps ...
    if order == "top_down":
        thaw_rank = thaw_rank[::-1]            # ... or unit M-1-j does
    return step >= thaw_rank * factor


def masked_by_schedule(tx: optax.GradientTransformation, unit_of_leaf: Params,
                       trainable) -> optax.GradientTransformationExtraArgs:
    """``tx`` updating only the leaves whose unit is ``trainable(step)`` (and that a ``frozen=``
    given to its update, e.g. a model's state, does not hold still); step counts updates."""
    tx = optax.with_extra_args_support(tx)

    def init(params):
        return tx.init(params), jnp.zeros((), jnp.int32)

    def update(grads, state, params=None, *, frozen=None, **extra_args):
        inner, step = state
        units = trainable(step)
        held = jax.tree.map(lambda u: jnp.logical_not(units[u]), unit_of_leaf)
        if frozen is not None:
            held = jax.tree.map(jnp.logical_or, held, frozen)
        updates, new_inner = frozen_update(tx, grads, inner, params, held, **extra_args)
        return updates, (new_inner, step + 1)

    return optax.GradientTransformationExtraArgs(init, update)


def gradual_unfreezing(algorithm: Algorithm, units: Sequence[Sequence[str]], fraction: float,
                       order: str = "bottom_up", *, frozen_last: int = 0,
                       name: str | None = None) -> Algorithm:
    """``algorithm`` whose clients train ``units`` (top-level parameter groups, input to output,
    each inner sequence thawing together) with FedBug's schedule at GU fraction ``fraction``."""
    if not isinstance(algorithm, Algorithm):
        raise FljaxError(f"gradual_unfreezing wraps an Algorithm, got {type(algorithm).__name__}")
    units = _check_units(units)
    check("fraction (the gradual-unfreezing share of the local steps)", fraction,
          lambda v: 0.0 <= v <= 1.0, "a number in [0, 1]")
    if not is_traced(fraction):
        fraction = float(fraction)
    if order not in ORDERS:
        raise FljaxError(f"order must be one of {ORDERS}, got {order!r}")
    if isinstance(frozen_last, bool) or not isinstance(frozen_last, int) or not (
            0 <= frozen_last < len(units)):
        raise FljaxError(f"frozen_last must be an integer in [0, {len(units) - 1}] (fewer than "
                         f"the {len(units)} units), got {frozen_last!r}")
    if frozen_last and not is_value(fraction, 0.0):
        raise FljaxError(f"frozen_last freezes the last units for the whole round; use it with "
                         f"fraction=0, got fraction={shown(fraction)}")
    unit_index = {group: j for j, unit in enumerate(units) for group in unit}

    def client_tx(ctx: ClientContext) -> optax.GradientTransformation:
        _check_groups(unit_index, ctx.params)
        factor = unfreeze_factor(fraction, ctx.num_steps, len(units), ctx.max_steps)
        unit_of_leaf = jax.tree_util.tree_map_with_path(
            lambda path, _: unit_index[path[0].key], ctx.params)
        return masked_by_schedule(
            algorithm.client_tx(ctx), unit_of_leaf,
            lambda step: trainable_units(step, factor, len(units), order, frozen_last))

    if name is None:
        variant = (f"frozen_last{frozen_last}" if frozen_last
                   else f"{order}{shown(fraction, 'g')}")
        name = f"{algorithm.name}+fedbug_{variant}"
    return algorithm._replace(name=name, client_tx=client_tx)


def _check_units(units) -> tuple[tuple[str, ...], ...]:
    if isinstance(units, str) or not isinstance(units, Sequence) or not units:
        raise FljaxError(f"units must be a non-empty sequence of sequences of parameter group "
                         f"names (input to output), got {units!r}")
    checked = []
    for unit in units:
        if isinstance(unit, str) or not isinstance(unit, Sequence) or not unit or not all(
                isinstance(group, str) for group in unit):
            raise FljaxError(f"each unit must be a non-empty sequence of parameter group names, "
                             f"got {unit!r} in units={units!r}")
        checked.append(tuple(unit))
    groups = [group for unit in checked for group in unit]
    repeated = sorted({group for group in groups if groups.count(group) > 1})
    if repeated:
        raise FljaxError(f"each parameter group must be in one unit only; {repeated} appear more "
                         f"than once in units={units!r}")
    return tuple(checked)


def _check_groups(unit_index: dict[str, int], params: Params) -> None:
    if not isinstance(params, Mapping):
        raise FljaxError(f"gradual_unfreezing needs params as a dict of top-level groups, got "
                         f"{type(params).__name__}")
    unknown = sorted(set(unit_index) - set(params))
    missing = [group for group in params if group not in unit_index]
    if unknown or missing:
        raise FljaxError(f"units must name every top-level parameter group exactly once; the "
                         f"model's groups are {list(params)}, unknown in units: {unknown}, "
                         f"not in any unit: {missing}")
