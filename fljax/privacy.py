"""User-level privacy accounting of ``fljax.algorithms.dp`` runs, with Google's ``dp_accounting``.

A round of DP-FedAvg is a sampled Gaussian mechanism over users: each user's clipped update has
norm <= C and the sum gets N(0, (z C)^2) noise (adaptive clipping included: its clip count is
charged inside z, Andrew et al. Theorem 1). T rounds compose T such events:

- Bernoulli participation (each of N users joins with q = m / N): ``PoissonSampledDpEvent(q,
  GaussianDpEvent(z))``, under the add-or-remove-one-user relation; the PLD or RDP accountant.
- Fixed-size cohorts (m distinct users of N): ``SampledWithoutReplacementDpEvent(N, m, ...)``,
  under the replace-one-user relation (N is public), where one user changes the clipped sum by up
  to 2C: ``dp_accounting`` takes the Gaussian's multiplier relative to that sensitivity, so the
  event is ``GaussianDpEvent(z / 2)``. Only the RDP accountant supports it (Wang et al. 2019,
  Theorem 27).

``epsilon`` is the spent budget after a number of rounds at a given delta; ``calibrate`` finds
the smallest z whose planned rounds spend at most a target epsilon
(``dp_accounting.calibrate_dp_mechanism``).
"""

from __future__ import annotations

import functools
import math

import dp_accounting
from dp_accounting import pld, rdp

from fljax.errors import FljaxError

ACCOUNTANTS = ("rdp", "pld")
MIN_NOISE = 0.01     # calibration gives up below this noise multiplier
Relation = dp_accounting.NeighboringRelation


def default_delta(num_clients: int) -> float:
    """delta = N^-1.1: below 1/N, the chance that some user's data leaks outright."""
    return float(num_clients) ** -1.1


def dp_event(noise_multiplier: float, *, cohort_size: int, num_clients: int,
             participation: str, rounds: int) -> dp_accounting.DpEvent:
    """The DpEvent of ``rounds`` rounds (module docstring)."""
    if participation == "bernoulli":
        one = dp_accounting.PoissonSampledDpEvent(cohort_size / num_clients,
                                                  dp_accounting.GaussianDpEvent(noise_multiplier))
    else:
        one = dp_accounting.SampledWithoutReplacementDpEvent(
            num_clients, cohort_size, dp_accounting.GaussianDpEvent(noise_multiplier / 2))
    return dp_accounting.SelfComposedDpEvent(one, rounds)


def accountant(name: str, participation: str) -> dp_accounting.PrivacyAccountant:
    """A fresh accountant ``name`` ('rdp' or 'pld') under the participation's relation."""
    if name not in ACCOUNTANTS:
        raise FljaxError(f"accountant must be one of {ACCOUNTANTS}, got {name!r}")
    if participation != "bernoulli":
        if name == "pld":
            raise FljaxError("accountant 'pld' cannot account fixed-size cohorts "
                             "(dp_accounting's PLD has no sampling without replacement): use "
                             "accountant 'rdp' or participation 'bernoulli'")
        return rdp.RdpAccountant(neighboring_relation=Relation.REPLACE_ONE)
    if name == "pld":
        return pld.PLDAccountant(Relation.ADD_OR_REMOVE_ONE)
    return rdp.RdpAccountant(neighboring_relation=Relation.ADD_OR_REMOVE_ONE)


@functools.lru_cache(maxsize=4096)   # every seed of a sweep's cell asks the same
def epsilon(noise_multiplier: float, rounds: int, delta: float, *, cohort_size: int,
            num_clients: int, participation: str = "uniform", accountant_name: str = "rdp"
            ) -> float:
    """epsilon spent by ``rounds`` rounds at ``delta`` (0 before any round, inf without noise)."""
    account = accountant(accountant_name, participation)   # checks the names first
    if rounds == 0:
        return 0.0
    if noise_multiplier == 0:
        return math.inf
    event = dp_event(noise_multiplier, cohort_size=cohort_size, num_clients=num_clients,
                     participation=participation, rounds=rounds)
    return float(account.compose(event).get_epsilon(delta))


@functools.lru_cache(maxsize=None)
def calibrate(target_epsilon: float, rounds: int, delta: float, *, cohort_size: int,
              num_clients: int, participation: str = "uniform",
              accountant_name: str = "rdp") -> float:
    """The smallest noise multiplier z (to 1e-4 relative) whose ``rounds`` rounds spend at most
    ``target_epsilon`` at ``delta``: a bracket found by doubling or halving z from 1, then
    ``dp_accounting.calibrate_dp_mechanism``'s bisection (a PLD at a tiny z would not fit in
    memory, so the bracket starts where the answer is)."""
    if not (math.isfinite(target_epsilon) and target_epsilon > 0):
        raise FljaxError(f"target_epsilon must be > 0 and finite, got {target_epsilon!r}")
    if rounds < 1:
        raise FljaxError(f"calibrating needs rounds >= 1, got {rounds!r}")
    spent = lambda z: epsilon(z, rounds, delta, cohort_size=cohort_size, num_clients=num_clients,
                              participation=participation, accountant_name=accountant_name)
    low, high = 1.0, 1.0
    while spent(high) > target_epsilon:
        low, high = high, 2 * high
    if low == high:
        while spent(low) <= target_epsilon:
            if low < MIN_NOISE:
                raise FljaxError(f"target_epsilon {target_epsilon:g} is met with almost no noise "
                                 f"(noise_multiplier < {MIN_NOISE:g}); train without dp instead")
            low, high = low / 2, low
    return float(dp_accounting.calibrate_dp_mechanism(
        lambda: accountant(accountant_name, participation),
        lambda z: dp_event(z, cohort_size=cohort_size, num_clients=num_clients,
                           participation=participation, rounds=rounds),
        target_epsilon, delta, dp_accounting.ExplicitBracketInterval(low, high), tol=1e-4 * low))
