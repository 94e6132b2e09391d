"""Probes: the papers' measurements of client drift, computed inside the compiled round."""

from fljax.probes.base import (ClientView, EvalView, Population, Probe, RoundView, squared_norm,
                               stacked, tree_dot)

__all__ = ["ClientView", "EvalView", "Population", "Probe", "RoundView", "squared_norm", "stacked",
           "tree_dot"]
