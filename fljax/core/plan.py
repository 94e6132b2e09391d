"""A round's static plan: ``make_round``'s arguments checked and resolved into the Python values
the compiled program is built from (no array of the state is touched here).

``plan_round`` raises ``FljaxError`` (one line naming the bad value and what is allowed) on a bad
argument, and resolves the defaults that depend on the backend: ``client_chunk`` (1 on CPU, the
cohort per device on GPU), ``run_chunk`` (1 on CPU, a device's runs on GPU), the local work's
static shape (``local_work``) and who reports in a round (``variable``: Bernoulli participation or
a deadline that drops clients).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from fljax.algorithms.base import Algorithm
from fljax.core.asynchronous import Asynchrony, check_asynchrony
from fljax.core.clients import LocalWork, model_loss
from fljax.core.placement import check_shardable, client_mesh, data_specs, put, shard_data
from fljax.data.federated import FederatedData
from fljax.errors import FljaxError
from fljax.models.model import Model
from fljax.population.clock import Clock
from fljax.population.cohort import AGGREGATIONS, PARTICIPATIONS
from fljax.population.stragglers import Deadline, check_deadline, sampled
from fljax.probes.base import Probe

AlgorithmOrBuilder = Algorithm | Callable[[Mapping[str, jax.Array]], Algorithm]


class RoundPlan(NamedTuple):
    """The static settings one round program is built from (Python values, resolved)."""

    model: Model
    loss_fn: Callable                 # the model's loss in the compute dtype (``model_loss``)
    augment: Callable | None
    work: LocalWork                   # the static shape of local training
    clients_per_round: int            # as given
    sampled_per_round: int            # clients sent the model (more under over-selection)
    participation: str
    aggregation: str
    bernoulli: bool
    variable: bool                    # who reports varies (Bernoulli, a deadline, dropout)
    capped: bool                      # a deadline cuts stragglers' local steps (partial work)
    client_chunk: int
    population_devices: int           # devices the population is sharded over (1: none)
    mesh: Mesh | None                 # the clients' mesh when the population is sharded
    probes: tuple
    clock: Clock | None
    deadline: Deadline | None
    asynchrony: Asynchrony | None
    run_chunk: int | None             # runs side by side in a batch (None: one run)


def plan_round(model: Model, datas: list[FederatedData], *, clients_per_round: int,
               batch_size: int | None, local_steps: int | None, local_epochs: int | None,
               aggregation: str, client_chunk: int | None, num_devices: int, augment,
               participation: str, probes: Sequence[Probe], unroll: int, compute_dtype,
               runs: int | None, run_chunk: int | None, clock: Clock | None,
               deadline: Deadline | None, asynchrony: Asynchrony | None
               ) -> tuple[RoundPlan, list[FederatedData]]:
    """Check ``make_round``'s arguments and resolve them: (the plan, the client data, placed on
    the clients' mesh when the population is sharded)."""
    counts = np.stack([np.asarray(d.count) for d in datas])
    batch = int(counts.max()) if batch_size is None else batch_size
    run_chunk = _check_runs(runs, run_chunk, num_devices)
    population_devices = num_devices if runs is None else 1   # a batch spreads its runs
    _check_round_args(counts.shape[1], clients_per_round, batch, local_steps, local_epochs,
                      aggregation, population_devices, participation)
    probes = _check_probes(probes)
    compute_dtype = _check_compute(unroll, compute_dtype)
    work = local_work(counts, batch, local_steps, local_epochs, unroll)
    bernoulli = participation == "bernoulli"
    _check_timing(clock, deadline, asynchrony, participation, population_devices, probes,
                  counts.shape[1])
    sampled_per_round = sampled(deadline, clients_per_round)
    client_chunk = _client_chunk(client_chunk, work.num_clients if bernoulli else
                                 sampled_per_round, sampled_per_round, population_devices)
    mesh = client_mesh(num_devices) if population_devices > 1 else None
    if mesh is not None:
        datas = [put(shard_data(datas[0], num_devices), data_specs(datas[0]), mesh)]
    plan = RoundPlan(
        model=model, loss_fn=model_loss(model, compute_dtype), augment=augment, work=work,
        clients_per_round=clients_per_round, sampled_per_round=sampled_per_round,
        participation=participation, aggregation=aggregation, bernoulli=bernoulli,
        variable=bernoulli or (deadline is not None and deadline != Deadline()),
        capped=deadline is not None and deadline.seconds is not None and (
            deadline.stragglers == "partial"),
        client_chunk=client_chunk, population_devices=population_devices, mesh=mesh,
        probes=probes, clock=clock, deadline=deadline, asynchrony=asynchrony,
        run_chunk=run_chunk)
    return plan, datas


def builder(algorithm: AlgorithmOrBuilder) -> Callable[[Mapping[str, Any]], Algorithm]:
    """``hparams -> Algorithm``: the given builder, or one returning the given Algorithm."""
    if isinstance(algorithm, Algorithm):
        def given(hparams):
            if hparams:
                raise FljaxError(f"the round's algorithm {algorithm.name!r} is built already, so "
                                 f"it takes no hyperparameters, got {sorted(hparams)}; give "
                                 f"make_round a function of them instead")
            return algorithm
        return given
    if not callable(algorithm):
        raise FljaxError(f"algorithm must be an Algorithm or a function of the run's "
                         f"hyperparameters returning one, got {type(algorithm).__name__}")

    def built(hparams):
        result = algorithm(dict(hparams))
        if not isinstance(result, Algorithm):
            raise FljaxError(f"the algorithm builder must return an Algorithm, got "
                             f"{type(result).__name__}")
        return result
    return built


def run_datas(data, runs: int | None) -> list[FederatedData]:
    """The client data as a list: one for every run, or one per run."""
    datas = [data] if isinstance(data, FederatedData) else list(data)
    if not datas or not all(isinstance(d, FederatedData) for d in datas):
        raise FljaxError("data must be a FederatedData, or a list of one per run")
    if len(datas) > 1 and len(datas) != runs:
        raise FljaxError(f"data lists {len(datas)} runs' client data; give one for every run or "
                         f"one per run (runs={runs})")
    return datas


def local_work(counts: np.ndarray, batch: int, local_steps: int | None,
               local_epochs: int | None, unroll: int = 1) -> LocalWork:
    """The static shape of local training over clients of sizes ``counts`` ([N], or [R, N] for
    R runs: the longest of every run; the mean number of examples is the first run's)."""
    counts = np.atleast_2d(counts)
    max_count = int(counts.max())
    if local_steps is not None:
        max_steps = local_steps
    else:
        max_steps = local_epochs * int(np.max((counts + batch - 1) // batch))
    return LocalWork(batch=batch, local_steps=local_steps, local_epochs=local_epochs,
                     max_steps=max_steps, max_count=max_count, num_clients=counts.shape[1],
                     mean_examples=float(counts[0].mean()), unroll=int(unroll))


def _check_timing(clock: Clock | None, deadline: Deadline | None,
                  asynchrony: Asynchrony | None, participation: str, devices: int,
                  probes: tuple, num_clients: int) -> None:
    """Raise FljaxError on a deadline or asynchrony without a clock, or one they cannot
    compose with."""
    if clock is not None and not isinstance(clock, Clock):
        raise FljaxError(f"clock must be a fljax.population.clock.Clock, got {type(clock).__name__}")
    if clock is not None and clock.step_times is not None and len(clock.step_times) != (
            num_clients):
        raise FljaxError(f"the clock's trace lists {len(clock.step_times)} clients' step times; "
                         f"the population has {num_clients}")
    if (deadline is not None or asynchrony is not None) and clock is None:
        raise FljaxError("a deadline or asynchrony needs a clock (make_round(..., clock=...))")
    if deadline is not None:
        check_deadline(deadline)
        if deadline.over_selection and participation == "bernoulli":
            raise FljaxError("over_selection samples more clients than clients_per_round; "
                             "Bernoulli participation samples no fixed number")
    if asynchrony is not None:
        check_asynchrony(asynchrony, num_clients)
        if deadline is not None:
            raise FljaxError("an asynchronous server has no round deadline: give a deadline or "
                             "asynchrony, not both")
        for what, bad in (("Bernoulli participation", participation == "bernoulli"),
                          ("a population sharded over devices", devices > 1),
                          ("probes (they measure a synchronous round)", bool(probes))):
            if bad:
                raise FljaxError(f"asynchronous training does not compose with {what}")


def _check_runs(runs: int | None, run_chunk: int | None, num_devices: int) -> int | None:
    """Raise FljaxError on bad ``runs`` / ``run_chunk``; return the chunk (None: unbatched).
    Default chunk: 1 on CPU (a scan over runs: each runs as fast as alone, and a conditional
    stays one), every run of a device on GPU (side by side)."""
    if runs is None:
        if run_chunk is not None:
            raise FljaxError(f"run_chunk needs runs (a batch of runs), got run_chunk={run_chunk}")
        return None
    if isinstance(runs, bool) or not isinstance(runs, (int, np.integer)) or runs < 1:
        raise FljaxError(f"runs must be an integer >= 1 or None, got {runs!r}")
    available = len(jax.devices())
    if not 1 <= num_devices <= available:
        raise FljaxError(f"num_devices must be in [1, {available}] (devices available), got "
                         f"{num_devices}")
    if runs % num_devices:
        raise FljaxError(f"a batch of runs is spread over the devices: runs ({runs}) must be a "
                         f"multiple of num_devices ({num_devices})")
    per_device = runs // num_devices
    if run_chunk is None:
        run_chunk = 1 if jax.default_backend() == "cpu" else per_device
    if isinstance(run_chunk, bool) or not isinstance(run_chunk, (int, np.integer)) or not (
            1 <= run_chunk <= per_device):
        raise FljaxError(f"run_chunk must be an integer in [1, {per_device}] (the runs per "
                         f"device), got {run_chunk!r}")
    return int(run_chunk)


def _check_probes(probes: Sequence[Probe]) -> tuple[Probe, ...]:
    probes = tuple(probes)
    names = [p.name for p in probes]
    if not all(isinstance(p, Probe) for p in probes):
        raise FljaxError(f"probes must be fljax.probes.Probe values, got "
                         f"{[type(p).__name__ for p in probes]}")
    if len(set(names)) != len(names):
        raise FljaxError(f"each probe may be given once, got {names}")
    return probes


def _client_chunk(client_chunk: int | None, slots: int, clients_per_round: int,
                  num_devices: int) -> int:
    per_device = slots // num_devices
    if client_chunk is None:
        wanted = 1 if jax.default_backend() == "cpu" else -(-clients_per_round // num_devices)
        client_chunk = max(c for c in range(1, wanted + 1) if per_device % c == 0)
    if client_chunk < 1 or per_device % client_chunk:
        raise FljaxError(f"client_chunk must divide the clients per device ({per_device}), got "
                         f"{client_chunk}")
    return client_chunk


def _check_compute(unroll: int, compute_dtype):
    """Raise FljaxError on a bad ``unroll`` or ``compute_dtype``; return the dtype (or None)."""
    if isinstance(unroll, bool) or not isinstance(unroll, (int, np.integer)) or unroll < 1:
        raise FljaxError(f"unroll must be an integer >= 1, got {unroll!r}")
    if compute_dtype is None:
        return None
    try:
        dtype = jnp.dtype(compute_dtype)
    except TypeError:
        dtype = None
    if dtype is None or not jnp.issubdtype(dtype, jnp.floating):
        raise FljaxError(f"compute_dtype must be a floating dtype (e.g. 'bfloat16', "
                         f"jnp.bfloat16) or None, got {compute_dtype!r}")
    return dtype


def _check_round_args(num_clients, clients_per_round, batch, local_steps, local_epochs,
                      aggregation, num_devices, participation):
    if not 1 <= clients_per_round <= num_clients:
        raise FljaxError(f"clients_per_round must be in [1, {num_clients}] (the number of "
                         f"clients), got {clients_per_round}")
    if batch < 1:
        raise FljaxError(f"batch_size must be >= 1 or None (full batch), got {batch}")
    if (local_steps is None) == (local_epochs is None):
        raise FljaxError("give exactly one of local_steps and local_epochs, got "
                         f"local_steps={local_steps}, local_epochs={local_epochs}")
    if (local_steps if local_steps is not None else local_epochs) < 1:
        raise FljaxError(f"local_steps / local_epochs must be >= 1, got "
                         f"{local_steps if local_steps is not None else local_epochs}")
    if aggregation not in AGGREGATIONS:
        raise FljaxError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
    available = len(jax.devices())
    if not 1 <= num_devices <= available:
        raise FljaxError(f"num_devices must be in [1, {available}] (devices available), got "
                         f"{num_devices}")
    if participation not in PARTICIPATIONS:
        raise FljaxError(f"participation must be one of {PARTICIPATIONS}, got {participation!r}")
    check_shardable(num_clients, num_devices)
    if participation == "uniform" and clients_per_round % num_devices:
        raise FljaxError(f"clients_per_round ({clients_per_round}) must be a multiple of "
                         f"num_devices ({num_devices})")
