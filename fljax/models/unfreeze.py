"""FedBug's unfreezing units: which parameter groups unfreeze together, input to output.

Kao & Wang, "FedBug: A Bottom-Up Gradual Unfreezing Framework for Federated Learning", official
``IandRover/FedBug`` ``utils_gu.py``. A ResNet unfreezes per residual Block (unit ``'B'``) or per
ResNet Module, i.e. stage (unit ``'M'``); the stem joins the first unit and the classifier the
last, so ResNet-18 has 8 Blocks / 4 Modules and ResNet-34 16 / 4. Models without residual blocks
(the CNNs) unfreeze layer by layer, whatever the unit, except ``tiny_cnn``: the official
Tiny-ImageNet schedule has 5 periods, and its third convolution is in no period, so it trains
from the first step with conv1 (``TINY_CNN_UNITS``).
"""

from __future__ import annotations

import re

from fljax.errors import FljaxError
from fljax.models.model import Model

UNFREEZE_UNITS = ("M", "B")
_BLOCK = re.compile(r"(layer\d+)_\d+")
# FedBug's Tiny-ImageNet CNN: conv1 and conv3 always train; conv2, fc1, fc2, fc3 thaw in turn
TINY_CNN_UNITS = (("conv1", "conv3"), ("conv2",), ("fc1",), ("fc2",), ("fc3",))


def unfreeze_units(model: Model, unit: str) -> tuple[tuple[str, ...], ...]:
    """``model.groups`` partitioned into units, input to output, each a tuple of group names
    (consecutive groups, except ``tiny_cnn``'s first unit).

    Residual blocks are the groups named ``layer{stage}_{block}`` (``fljax.models.resnet``); groups
    before the first block join the first unit, groups after the last block the last unit.
    """
    if unit not in UNFREEZE_UNITS:
        raise FljaxError(f"unfreeze unit must be one of {UNFREEZE_UNITS} ('M': ResNet Module, "
                         f"'B': residual Block), got {unit!r}")
    if model.name == "tiny_cnn":
        return TINY_CNN_UNITS
    blocks = [i for i, g in enumerate(model.groups) if _BLOCK.fullmatch(g)]
    if not blocks:
        return tuple((g,) for g in model.groups)
    units: dict[str, list[str]] = {}
    for g in model.groups[blocks[0]:blocks[-1] + 1]:
        block = _BLOCK.fullmatch(g)
        units.setdefault(block.group(1) if unit == "M" and block else g, []).append(g)
    units = list(units.values())
    units[0] = list(model.groups[:blocks[0]]) + units[0]
    units[-1] = units[-1] + list(model.groups[blocks[-1] + 1:])
    return tuple(tuple(u) for u in units)
