"""One communication round as ONE compiled XLA program.

``round_fn = make_round(algorithm, model, data, ...)``; ``state, metrics = round_fn(state)``.
Inside the program: the cohort is sampled (``fljax.population.cohort``), each sampled client's
state is gathered, every client runs its local steps as a ``lax.scan`` (``fljax.core.clients``),
clients run side by side (``vmap``), one after another (``lax.scan`` over clients) or in chunks of
``client_chunk``, and over several devices (of one or more processes) the population is sharded
and the cohort dealt across a device mesh (``fljax.core.cohort_training``,
``fljax.core.placement``). Then the server update, the scatter of client states, and the probes
(``fljax.probes``), if any. The state is donated; randomness is ``fold_in(key, round)``, so a
resumed run repeats an uninterrupted one exactly.

The round is composed of parts, each in its own module: the checked static settings
(``fljax.core.plan``), the synchronous round (``fljax.core.synchronous``) or the asynchronous
server step (``fljax.core.asynchronous``), and, for many runs in one program, the batched round
(``fljax.core.runs.batch_runs``).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fljax.accounting import hlo_flops
from fljax.algorithms.base import Algorithm, Params
from fljax.core.asynchronous import Asynchrony, asynchronous_step, initial_flight
from fljax.core.clients import local_training
from fljax.core.placement import RUNS, put, state_specs
from fljax.core.plan import AlgorithmOrBuilder, builder, plan_round, run_datas
from fljax.core.runs import batch_runs, data_of, hparams_of, run_hparams, stack
from fljax.core.synchronous import synchronous_step
from fljax.data.federated import FederatedData
from fljax.errors import FljaxError
from fljax.fielddocs import document_fields
from fljax.models.model import Model
from fljax.population.clock import Clock
from fljax.population.cohort import (AGGREGATIONS, PARTICIPATIONS, bernoulli_cohort, client_keys,
                                     cohort_weights, round_key, sample_cohort, stream_keys)
from fljax.population.stragglers import Deadline
from fljax.probes.base import EvalView, Probe

__all__ = ["AGGREGATIONS", "PARTICIPATIONS", "RoundFunction", "RoundState", "bernoulli_cohort",
           "client_keys", "cohort_weights", "init_state", "local_training", "make_round",
           "round_key", "sample_cohort", "stream_keys"]


class RoundState(NamedTuple):
    """The whole state of an experiment between rounds: what the round function takes and returns
    (and a checkpoint holds)."""

    round: jax.Array
    key: jax.Array
    params: Params
    server_state: Any
    client_states: Any
    probes: Any = {}
    hparams: Any = {}
    clock: Any = ()


document_fields(RoundState, {
    "round": "shape=(), int32: the rounds done so far",
    "key": "shape=(2,), uint32: the experiment's root key",
    "params": "the global model w^t",
    "server_state": "the algorithm's server state (``Algorithm.server_init``)",
    "client_states": "every client's state, stacked on a leading axis of num_clients",
    "probes": "{probe name: (server state, per-client states stacked over N)}",
    "hparams": "{name: scalar}: the traced hyperparameters the round builds its algorithm from "
               "({} for an algorithm of Python numbers)",
    "clock": "simulated time: () without a clock; the time so far (shape=()); asynchronous: the "
             "clients in flight (``fljax.core.asynchronous.Flight``)",
})


def init_state(algorithm: Algorithm, params: Params, num_clients: int, seed: int,
               probes: Sequence[Probe] = (), hparams: Mapping[str, jax.Array] | None = None,
               timing: tuple = (None, None)) -> RoundState:
    """Round 0: the server's and every client's initial state (as device arrays), and every
    probe's. The state owns fresh copies of ``params``: the round donates its state, and the
    caller's arrays stay usable (e.g. to start a second algorithm from the same initial model).
    ``hparams``: the values ``algorithm`` was built from, when the round builds it from them.
    ``timing``: the round's (clock, asynchrony), when it has a clock (``round_fn.init_state``
    passes them)."""
    return _initial_state(algorithm, params, num_clients, jax.random.PRNGKey(seed), probes,
                          dict(hparams or {}), timing)


def _initial_state(algorithm: Algorithm, params: Params, num_clients: int, key: jax.Array,
                   probes: Sequence[Probe], hparams: dict, timing: tuple = (None, None)
                   ) -> RoundState:
    params = jax.tree.map(lambda leaf: jnp.array(leaf, copy=True), params)
    client_state = algorithm.client_init(params)
    stacked = jax.tree.map(lambda x: jnp.broadcast_to(x, (num_clients, *x.shape)).copy(),
                           client_state)
    clock, asynchrony = timing
    time = ()
    if asynchrony is not None:
        time = initial_flight(asynchrony, key, params, num_clients)
    elif clock is not None:
        time = jnp.zeros((), jax.tree.leaves(params)[0].dtype)
    return RoundState(round=jnp.zeros((), jnp.int32), key=key, params=params,
                      server_state=algorithm.server_init(params), client_states=stacked,
                      probes={p.name: p.init(params, num_clients) for p in probes},
                      hparams=hparams, clock=time)


class RoundFunction:
    """``state, metrics = round_fn(state)``: a jitted, state-donating communication round.

    A batched round (``make_round(..., runs=R)``) advances R runs at once: its state and metrics
    have a leading run axis, and ``round_fn(state, active)`` leaves the runs whose ``active``
    entry is False unchanged (a finished or diverged run waiting for the others)."""

    def __init__(self, jitted, data: FederatedData, mesh: Mesh | None,
                 algorithm: AlgorithmOrBuilder, model: Model, probes: tuple[Probe, ...],
                 runs: int | None = None, data_axes: Any = None, means: jax.Array | None = None,
                 timing: tuple = (None, None)):
        self._jitted = jitted
        self.timing = timing             # (clock, asynchrony)
        self._data = data
        self._given = algorithm if isinstance(algorithm, Algorithm) else None
        self._build = builder(algorithm)
        self._data_axes = data_axes
        self._means = means
        self.mesh = mesh
        self.model = model
        self.probes = probes
        self.runs = runs
        self.num_clients = int(data.count.shape[-1])     # N, of every run

    def __call__(self, state: RoundState, active=None) -> tuple[RoundState, dict]:
        if set(state.probes) != {p.name for p in self.probes}:
            raise FljaxError(f"the state holds probes {sorted(state.probes)} but the round runs "
                             f"{sorted(p.name for p in self.probes)}; build the state with "
                             f"round_fn.init_state(...) or init_state(..., probes=...)")
        return self._jitted(*self._arguments(state, active))

    def _arguments(self, state: RoundState, active=None) -> tuple:
        if self.runs is None:
            return state, self._data
        active = np.ones(self.runs, bool) if active is None else np.asarray(active, bool)
        if active.shape != (self.runs,):
            raise FljaxError(f"active must hold one flag per run ({self.runs}), got shape "
                             f"{active.shape}")
        return state, self._data, self._means, active

    @property
    def algorithm(self) -> Algorithm:
        """The algorithm of a round built from an Algorithm (not from a builder of traced
        hyperparameters: use ``algorithm_of(state)``)."""
        if self._given is None:
            raise FljaxError("this round builds its algorithm from each run's hyperparameters; "
                             "use round_fn.algorithm_of(state)")
        return self._given

    def algorithm_of(self, state: RoundState) -> Algorithm:
        """The algorithm of one run's (unbatched) state, built on the host from its concrete
        hyperparameters: for what runs outside the round (evaluation models, payloads). A round
        built from an Algorithm returns it (a run of a batch is evaluated with its own round,
        whose algorithm has that run's values; its state still holds them as hparams)."""
        if self._given is not None:
            return self._given
        return self._build(jax.device_get(state.hparams))

    def data_of(self, run: int | None = None) -> FederatedData:
        """The client data of run ``run`` (of the only run when unbatched)."""
        if self.runs is None or self._data_axes is None:
            return self._data
        return data_of(self._data, self._data_axes, run)

    def init_state(self, params: Params, seed, hparams: Mapping[str, Any] | None = None
                   ) -> RoundState:
        """The initial state of this round's algorithm and probes, placed for the round: over a
        mesh, each device builds only its own clients' rows.

        ``hparams``: the traced hyperparameters ({name: number}) when the round builds its
        algorithm from them. Batched (``runs=R``): ``params`` is one model for every run or a
        list of R, ``seed`` a list of R seeds and ``hparams`` {name: [R numbers]}; each run's
        values are checked on the host (its algorithm is built from them) first."""
        one_model = params[0] if isinstance(params, (list, tuple)) else params
        dtype = jax.tree.leaves(one_model)[0].dtype      # the hyperparameters' float dtype
        if self.runs is None:
            values = hparams_of(hparams or {}, dtype)
            algorithm = self._build(values)
            build = functools.partial(init_state, algorithm, num_clients=self.num_clients,
                                      seed=seed, probes=self.probes, hparams=values,
                                      timing=self.timing)
            if self.mesh is None:
                return build(params)
            params = jax.tree.map(np.asarray, params)  # host values: the same on every process
            shardings = jax.tree.map(lambda spec: NamedSharding(self.mesh, spec),
                                     state_specs(jax.eval_shape(build, params)))
            return jax.jit(build, out_shardings=shardings)(params)
        seeds = list(np.atleast_1d(seed))
        if len(seeds) != self.runs:
            raise FljaxError(f"a batch of {self.runs} runs needs {self.runs} seeds, got "
                             f"{len(seeds)}")
        per_run = [hparams_of(values, dtype) for values in run_hparams(hparams, self.runs)]
        for values in per_run:
            self._build(values)                       # each run's values checked on the host
        if not isinstance(params, (list, tuple)):
            params = [params] * self.runs
        if len(params) != self.runs:
            raise FljaxError(f"a batch of {self.runs} runs needs one model or {self.runs}, got "
                             f"{len(params)}")
        keys = jnp.stack([jax.random.PRNGKey(s) for s in seeds])

        def one(p, key, values):
            return _initial_state(self._build(values), p, self.num_clients, key,
                                  self.probes, values, self.timing)

        init = jax.vmap(one)
        if self.mesh is not None:
            init = jax.jit(init, out_shardings=NamedSharding(self.mesh, P(RUNS)))
        return jax.jit(init)(stack(params), keys, stack(per_run))

    def place(self, state: RoundState) -> RoundState:
        """Put a state where the round expects it: over a mesh, per-client states sharded on the
        client axis and the rest replicated (``fljax.core.placement``); a batch's runs spread over
        the devices."""
        if self.mesh is None:
            return state
        return put(state, self._state_specs(state), self.mesh)

    def _state_specs(self, state: RoundState):
        if self.runs is not None:
            return jax.tree.map(lambda _: P(RUNS), state)
        return state_specs(state)

    def lower(self, state: RoundState):
        """The round lowered for ``state`` (``.as_text()``, ``.compile()``)."""
        return self._jitted.lower(*self._arguments(state))

    def flops(self, state: RoundState, elementwise: bool = False) -> float:
        """FLOPs of one round as compiled (``fljax.accounting.hlo_flops``: matmuls and
        convolutions, with ``elementwise`` elementwise ops and reductions too; every client slot
        of a Bernoulli round counted; every run of a batch; over a mesh, the program of one device
        times the devices). After a first call this reuses the compiled program."""
        devices = 1 if self.mesh is None else self.mesh.size
        return devices * hlo_flops(self.lower(state).compile().as_text(), elementwise)

    def probe_scores(self, state: RoundState, evaluate: Callable[[Params], dict],
                     out_dir: str | None = None, run: int | None = None) -> dict[str, float]:
        """The probes' evaluation-time scores of ``state`` (one run's: ``run`` of a batch), e.g.
        the mean of all local models, the interaction tensor at its rounds, on the host."""
        scores = {}
        for probe in self.probes:
            if probe.evaluate is not None:
                scores.update(probe.evaluate(EvalView(
                    round=int(state.round), state=state, probe_state=state.probes[probe.name],
                    model=self.model, algorithm=self.algorithm_of(state),
                    data=self.data_of(run), evaluate=evaluate, out_dir=out_dir)))
        return scores

    def compilations(self) -> int:
        """How many programs the round has compiled so far (1 after any number of calls)."""
        return self._jitted._cache_size()


def make_round(algorithm: AlgorithmOrBuilder, model: Model,
               data: FederatedData | Sequence[FederatedData], *, clients_per_round: int,
               batch_size: int | None, local_steps: int | None = None,
               local_epochs: int | None = None, aggregation: str = "examples",
               client_chunk: int | None = None, num_devices: int = 1,
               augment: Callable[[jax.Array, jax.Array], jax.Array] | None = None,
               participation: str = "uniform", probes: Sequence[Probe] = (), unroll: int = 1,
               compute_dtype=None, runs: int | None = None,
               run_chunk: int | None = None, clock: Clock | None = None,
               deadline: Deadline | None = None,
               asynchrony: Asynchrony | None = None) -> RoundFunction:
    """Compile-ready round of ``algorithm`` training ``model`` on ``data``.

    ``algorithm`` is an Algorithm, or a function ``hparams -> Algorithm`` of the run's
    hyperparameters ({name: scalar array}, ``RoundState.hparams``, given to ``init_state``): the
    round builds the algorithm from them while it is traced, so one compiled program serves
    every value (e.g. ``lambda h: fljax.fedprox(fljax.local_sgd(h["lr"]), mu=h["mu"])``).

    ``runs=R`` trains R independent runs in one program (``fljax.core.runs``): the state has a
    leading run axis (``round_fn.init_state(params, seeds, hparams)``), each run its own seed and
    hyperparameter values, ``data`` is one FederatedData for every run or a list of R (the same
    number of clients), the metrics a leading run axis; ``num_devices`` spreads the runs over
    devices, ``run_chunk`` of them side by side (default 1 on CPU, a device's all on GPU). Run r
    reaches the model of the same run alone up to float rounding.

    Local work is exactly one of ``local_steps`` (K steps) or ``local_epochs`` (E passes, i.e.
    E*ceil(n_i/B) steps for client i; clients with fewer steps mask the rest). ``batch_size=None``
    is the full local dataset (FedSGD). ``client_chunk`` clients run side by side (vmap) at a time:
    1 is a sequential scan over clients (fastest on CPU), ``clients_per_round / num_devices`` is a
    full vmap (GPU); default: 1 on CPU, all on GPU. ``num_devices`` > 1 shards the population
    (client data and per-client states, ``fljax.core.placement``) and each cohort over that many
    devices, of every process. ``augment(key, x) -> x`` transforms each training batch.

    ``participation='uniform'`` samples ``clients_per_round`` distinct clients; 'bernoulli' lets
    each client join with probability C = clients_per_round / N (``bernoulli_cohort``; the FedDyn,
    FedBug and FL-Simulator code). The program then has a slot for every client and skips the
    slots of those who did not join: with ``client_chunk`` c, a round costs only the chunks of c
    slots that hold someone (default c: 1 on CPU, the expected cohort per device on GPU).

    ``unroll``: local steps per iteration of the ``lax.scan`` over a client's steps (the same
    results; fewer, longer loop iterations). ``compute_dtype`` (e.g. ``jnp.bfloat16``): the
    model's forward and backward passes in that dtype, with parameters, gradients and optimizer
    state in the parameters' own dtype (``fljax.core.clients.model_loss``); None: the parameters'.

    ``probes`` (``fljax.probes``) are measurements computed inside the round and returned in its
    metrics; their state lives in ``state.probes`` (build it with ``round_fn.init_state``). With
    no probe the round is the same program as without them.

    ``clock`` (``fljax.population.clock``) gives every client's local work a simulated duration; the state
    keeps the simulated time and each round reports ``sim_time``, ``round_time``, ``sampled``
    (the clients sent the model) and ``reported``. With it,
    ``deadline`` (``fljax.population.stragglers``) sets what a synchronous round does with stragglers,
    dropout and over-selection, and ``asynchrony`` (``fljax.core.asynchronous``) makes a "round" one
    server step of FedBuff or FedAsync, clients in flight in the state. Build the state with
    ``round_fn.init_state``.

    Metrics of a round: ``train_loss`` (the p_i-weighted mean local loss), ``clients`` (the
    cohort; -1 for a Bernoulli slot nobody took, or a client that did not report), ``client_steps``,
    ``params_finite``, the cohort mean of each of the algorithm's ``client_metrics``, and each
    probe's metrics.
    """
    build = builder(algorithm)
    plan, datas = plan_round(
        model, run_datas(data, runs), clients_per_round=clients_per_round,
        batch_size=batch_size, local_steps=local_steps, local_epochs=local_epochs,
        aggregation=aggregation, client_chunk=client_chunk, num_devices=num_devices,
        augment=augment, participation=participation, probes=probes, unroll=unroll,
        compute_dtype=compute_dtype, runs=runs, run_chunk=run_chunk, clock=clock,
        deadline=deadline, asynchrony=asynchrony)
    step = (synchronous_step if asynchrony is None else asynchronous_step)(build, plan)
    timing = (clock, asynchrony)
    if runs is None:
        return RoundFunction(jax.jit(step, donate_argnums=0), datas[0], plan.mesh, algorithm,
                             model, plan.probes, timing=timing)
    batched, data, mesh, axes, means = batch_runs(step, datas, runs, plan.run_chunk, num_devices)
    return RoundFunction(jax.jit(batched, donate_argnums=0), data, mesh, algorithm, model,
                         plan.probes, runs, axes, means, timing)
