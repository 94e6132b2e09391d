"""One communication round as ONE compiled XLA program.

``round_fn = make_round(algorithm, model, data, ...)``; ``state, metrics = round_fn(state)``.
Inside the program: the cohort is sampled (``fljax.population.cohort``), each sampled client's state is
gathered, every client runs its local steps as a ``lax.scan`` (``fljax.core.clients``), clients run side
by side (``vmap``), one after another (``lax.scan`` over clients) or in chunks of ``client_chunk``,
and over several devices (of one or more processes) the population is sharded and the cohort
dealt across a device mesh (``shard_map``: the sampled clients' rows and examples travel to their
slots and back, messages are ``psum``-ed; ``fljax.core.placement``). Then the server update, the
scatter of client states, and the probes
(``fljax.probes``), if any. The state is donated; randomness is ``fold_in(key, round)``, so a
resumed run repeats an uninterrupted one exactly.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fljax.accounting import hlo_flops
from fljax.algorithms.base import Algorithm, CohortMessages, Params
from fljax.core.asynchronous import Asynchrony, async_round, check_algorithm, check_asynchrony
from fljax.core.asynchronous import initial_flight
from fljax.core.clients import (LocalWork, client_context, client_steps, full_gradient, joined_only,
                           local_training, map_sum, model_loss)
from fljax.population.clock import Clock
from fljax.population.cohort import (AGGREGATIONS, PARTICIPATIONS, bernoulli_cohort, client_keys,
                          cohort_weights, draw_cohort, message_keys, round_key, sample_cohort,
                          server_key, stream_keys)
from fljax.data.federated import FederatedData
from fljax.errors import FljaxError
from fljax.fielddocs import document_fields
from fljax.population.stragglers import Deadline, check_deadline, sampled, settle
from fljax.models.model import Model
from fljax.core.placement import (AXIS, RUNS, check_shardable, client_mesh, data_specs,
                             device_index, global_layout, put, shard_data, state_specs)
from fljax.probes.base import ClientView, EvalView, Population, Probe, RoundView
from fljax.core.runs import data_of, hparams_of, run_hparams, stack, stack_data

# The per-client output an Algorithm.aggregate collects (beside the metrics, gathered like them),
# and the fold_in data of its key, beside the server's SERVER_STREAM.
STACKED = "_cohort_messages"
AGGREGATE_STREAM = 0xA66

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


AlgorithmOrBuilder = Algorithm | Callable[[Mapping[str, jax.Array]], Algorithm]


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
        self._build = _builder(algorithm)
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
    leading run axis (``round_fn.init_state(params, seeds, hparams)``), each run has its own
    seed and hyperparameter values, ``data`` is one FederatedData for every run or a list of R
    (each run's own split; the runs must have the same number of clients), and the metrics
    have a leading run axis; ``num_devices`` spreads the runs over devices. ``run_chunk`` runs
    go side by side (vmap) at a time, a scan over the chunks; default 1 on CPU (one run after
    another: each as fast as alone), all of a device's on GPU. Run r of a batch samples the
    cohorts and batches of the same run alone and reaches the same model up to float rounding.
    Side by side, a conditional on a per-run value computes both branches: a Bernoulli round
    trains every slot (not only the chunks that hold someone), and a ``switch`` computes both
    algorithms' local work.

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
    slots of those who did not join: with ``client_chunk`` c, a round costs the ceil(|S|/c) chunks
    that hold someone (default c: 1 on CPU, the expected cohort per device on GPU).

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
    build = _builder(algorithm)
    datas = _run_datas(data, runs)
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
    variable = bernoulli or (deadline is not None and deadline != Deadline())  # who reports varies
    capped = deadline is not None and deadline.seconds is not None and (
        deadline.stragglers == "partial")
    client_chunk = _client_chunk(client_chunk, work.num_clients if bernoulli else
                                 sampled_per_round, sampled_per_round, population_devices)
    loss_fn = model_loss(model, compute_dtype)
    clients = client_mesh(num_devices) if population_devices > 1 else None
    if clients is not None:
        datas = [put(shard_data(datas[0], num_devices), data_specs(datas[0]), clients)]

    def async_round_fn(state: RoundState, data: FederatedData, mean_examples=None):
        algorithm = build(state.hparams)
        check_algorithm(algorithm, state.params)
        run_work = work if mean_examples is None else work._replace(mean_examples=mean_examples)
        run_clients = _cohort_runner(algorithm, (), run_work, model, augment, 1, False,
                                     asynchrony.buffer, False, loss_fn)

        def train_one(client_id, weight, started, start):
            """One finisher, trained from its start model as a client of round ``started``."""
            one = client_id[None]
            _, (message, _), metrics = run_clients(
                one, one, (state.client_states, {}), weight[None], jnp.ones(1, bool),
                asynchrony.buffer, start, state.server_state, started,
                round_key(state.key, started)[1], data)
            return message, jax.tree.map(lambda a: a[0], metrics)

        return async_round(asynchrony, clock, algorithm, train_one,
                           lambda ids: client_steps(run_work, data.count[ids]), data.count,
                           aggregation, state, data)

    def round_fn(state: RoundState, data: FederatedData, mean_examples=None):
        algorithm = build(state.hparams)
        run_work = work if mean_examples is None else work._replace(mean_examples=mean_examples)
        run_clients = _cohort_runner(algorithm, probes, run_work, model, augment, client_chunk,
                                     variable, sampled_per_round, clients is not None, loss_fn)
        train_cohort = _cohort_on_devices(run_clients, clients, run_work, bernoulli)
        sample_key, client_key = round_key(state.key, state.round)
        dtype = jax.tree.leaves(state.params)[0].dtype
        cohort = draw_cohort(sample_key, data.count, clients_per_round=sampled_per_round,
                             participation=participation, aggregation=aggregation, dtype=dtype,
                             num_devices=population_devices)
        caps, timing_metrics, time = None, {}, state.clock
        if clock is not None:
            if isinstance(state.clock, tuple):
                raise FljaxError("the round has a clock but the state holds no simulated time; "
                                 "build the state with round_fn.init_state(...)")
            sent = cohort.size                   # every sampled client was sent the model
            cohort, steps, elapsed = settle(
                deadline, clock, state.key, state.round, cohort,
                client_steps(run_work, data.count[cohort.ids]), data.count[cohort.ids],
                aggregation, clients_per_round)
            caps = steps if capped else None
            time = state.clock + elapsed
            timing_metrics = {"sim_time": time, "round_time": elapsed,
                              "sampled": sent, "reported": cohort.size}
        (client_states, probe_clients), (message, probe_sums), metrics = train_cohort(
            cohort, _rows(state), state.params, state.server_state, state.round, client_key,
            data, caps)
        aggregate_metrics = {}
        if algorithm.aggregate is not None:
            message, aggregate_metrics = algorithm.aggregate(CohortMessages(
                metrics.pop(STACKED), cohort.weights, cohort.joined, cohort.ids,
                data.num_clients, state.server_state, state.round,
                jax.random.fold_in(server_key(state.key, state.round), AGGREGATE_STREAM)))
        if algorithm.perturb is not None:
            message = algorithm.perturb(message, state.server_state,
                                        server_key(state.key, state.round))
        params, server_state = algorithm.server_update(state.params, state.server_state, message,
                                                       state.round)
        new_state = state._replace(round=state.round + 1, params=params,
                                   server_state=server_state, client_states=client_states,
                                   clock=time)
        round_metrics = {**_round_metrics(params, cohort, metrics, variable), **timing_metrics,
                         **aggregate_metrics}
        if algorithm.observe is not None or probes:
            if clients is not None:
                data = global_layout(data, population_devices)
            population = _population(run_work, loss_fn, data, aggregation, dtype, state.round,
                                     cohort.size)
            new_state, observed = _observe(algorithm, probes, state, new_state, cohort,
                                           probe_sums, probe_clients, population)
            round_metrics = _merge(round_metrics, observed)
        return new_state, round_metrics

    timing = (clock, asynchrony)
    step = round_fn if asynchrony is None else async_round_fn
    if runs is None:
        return RoundFunction(jax.jit(step, donate_argnums=0), datas[0], clients, algorithm,
                             model, probes, timing=timing)
    data, axes = stack_data(datas) if len(datas) > 1 else (datas[0], _shared_axes(datas[0]))
    means = counts.mean(axis=1)
    means = None if np.all(means == means[0]) else jnp.asarray(
        means, jax.dtypes.canonicalize_dtype(jnp.float64))
    runs_mesh = client_mesh(num_devices, RUNS) if num_devices > 1 else None
    if runs_mesh is not None:
        data = put(data, jax.tree.map(lambda axis: P() if axis is None else P(RUNS), axes,
                                      is_leaf=lambda a: a is None), runs_mesh)
    batched = _batched(step, axes, means is not None, runs, run_chunk, runs_mesh)
    return RoundFunction(jax.jit(batched, donate_argnums=0), data, runs_mesh, algorithm, model,
                         probes, runs, axes if len(datas) > 1 else None, means, timing)


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


def _builder(algorithm: AlgorithmOrBuilder) -> Callable[[Mapping[str, Any]], Algorithm]:
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


def _run_datas(data, runs: int | None) -> list[FederatedData]:
    """The client data as a list: one for every run, or one per run."""
    datas = [data] if isinstance(data, FederatedData) else list(data)
    if not datas or not all(isinstance(d, FederatedData) for d in datas):
        raise FljaxError("data must be a FederatedData, or a list of one per run")
    if len(datas) > 1 and len(datas) != runs:
        raise FljaxError(f"data lists {len(datas)} runs' client data; give one for every run or "
                         f"one per run (runs={runs})")
    return datas


def _shared_axes(data: FederatedData) -> FederatedData:
    """Every leaf of ``data`` shared by the runs (vmap axis None)."""
    return jax.tree.map(lambda _: None, data)


def _batched(round_fn: Callable, data_axes: Any, per_run_means: bool, runs: int,
             run_chunk: int, mesh: Mesh | None) -> Callable:
    """``(state, data, means, active) -> (state, metrics)`` of R runs: ``round_fn`` over the
    leading run axis of the state (and of the per-run data and example means), ``run_chunk``
    runs side by side (vmap) at a time, a scan over the chunks; over a ``mesh`` (axis 'runs')
    each device takes R/D of the runs. A run whose ``active`` flag is False keeps its state."""
    axis_leaves, _ = jax.tree.flatten(data_axes, is_leaf=lambda a: a is None)

    def batched(state, data, means, active):
        leaves, tree = jax.tree.flatten(data)
        per_run = [a for a, axis in zip(leaves, axis_leaves) if axis is not None]

        def one(xs):
            run_state, run_leaves, mean = xs
            mapped = iter(run_leaves)
            run_data = jax.tree.unflatten(tree, [next(mapped) if axis is not None else a
                                                 for a, axis in zip(leaves, axis_leaves)])
            return round_fn(run_state, run_data, mean)

        xs = (state, per_run, means if per_run_means else None)
        if run_chunk == 1:    # a scan over runs: conditionals stay conditionals, and a run
            def maybe(xs_active):     # that is not active costs nothing
                xs, on = xs_active
                _, metrics_shape = jax.eval_shape(one, xs)
                idle = lambda: (xs[0], jax.tree.map(lambda m: jnp.zeros(m.shape, m.dtype),
                                                    metrics_shape))
                return jax.lax.cond(on, lambda: one(xs), idle)
            return jax.lax.map(maybe, (xs, active))
        if run_chunk >= active.shape[0]:
            new_state, metrics = jax.vmap(one)(xs)
        else:
            new_state, metrics = jax.lax.map(one, xs, batch_size=run_chunk)
        keep = lambda new, old: jnp.where(active.reshape(-1, *(1,) * (new.ndim - 1)), new, old)
        return jax.tree.map(keep, new_state, state), metrics

    if mesh is None:
        return batched
    data_specs_ = jax.tree.map(lambda axis: P() if axis is None else P(RUNS), data_axes,
                               is_leaf=lambda a: a is None)
    return jax.shard_map(batched, mesh=mesh,
                         in_specs=(P(RUNS), data_specs_, P(RUNS) if per_run_means else P(),
                                   P(RUNS)),
                         out_specs=(P(RUNS), P(RUNS)), check_vma=False)


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


def _cohort_on_devices(run_clients, mesh: Mesh | None, work: LocalWork, bernoulli: bool):
    """``train(cohort, rows, w, server state, t, key, data, caps=None) -> (every client's new
    rows, summed outputs, per-slot metrics)``: ``run_clients`` on the cohort, over the mesh if
    any; ``caps``: each slot's local steps when a deadline cuts them short.

    Client i's rows and examples live on device i // (N/D) (``fljax.core.placement``). A uniform
    cohort is dealt out in D equal shares of slots: each sampled client's rows and examples are
    sent to the device of its slot (a masked gather on the owner, ``psum``-ed), and its new rows
    back to the owner (``all_gather``, then a scatter where owned). A Bernoulli round has a slot
    for every client, and each device trains its own clients where they are."""
    sharded = mesh is not None
    moves = sharded and not bernoulli
    devices = mesh.size if sharded else 1
    per_device = work.num_clients // devices
    psum = (lambda tree: jax.lax.psum(tree, AXIS)) if sharded else (lambda tree: tree)

    def on_device(ids, joined, weights, cohort_ids, size, rows, params, server_state,
                  round_index, key, data, caps):
        d = device_index(sharded)
        if moves:
            owned = cohort_ids // per_device == d
            at = jnp.where(owned, cohort_ids - d * per_device, per_device)   # dropped if not
            slots = ids.shape[0]
            mine = lambda a: jax.lax.dynamic_slice_in_dim(a, d * slots, slots)
            cohort_rows = jax.tree.map(lambda a: mine(_from_owners(a.at[at].get(mode="clip"),
                                                                   owned, psum)), rows)
            cohort_data = _cohort_data(data, cohort_ids, owned, work.max_count, mine, psum)
            data_rows = jnp.arange(slots)
        else:
            at = data_rows = ids
            if sharded:
                at = ids - d * per_device
            cohort_rows, cohort_data = jax.tree.map(lambda a: a[at], rows), data
        new_rows, sums, metrics = run_clients(ids, data_rows, cohort_rows, weights, joined,
                                              size, params, server_state, round_index, key,
                                              cohort_data, caps)
        if moves:
            new_rows = jax.lax.all_gather(new_rows, AXIS, tiled=True)
        rows = jax.tree.map(lambda a, new: a.at[at].set(new, mode="drop"), rows, new_rows)
        if sharded:
            metrics = jax.lax.all_gather(metrics, AXIS, tiled=True)
        return rows, psum(sums), metrics

    def train(cohort, rows, params, server_state, round_index, key, data, caps=None):
        fn = on_device
        if sharded:
            fn = jax.shard_map(
                on_device, mesh=mesh,
                in_specs=(P(AXIS), P(AXIS), P(AXIS), P(), P(), P(AXIS), P(), P(), P(), P(),
                          data_specs(data), P(AXIS)),
                out_specs=(P(AXIS), P(), P()), check_vma=False)
        return fn(cohort.ids, cohort.joined, cohort.weights, cohort.ids, cohort.size, rows,
                  params, server_state, round_index, key, data, caps)

    return train


def _from_owners(gathered, owned: jax.Array, psum):
    """Rows gathered on every device, kept where this device ``owned`` them and summed over the
    devices: each row exactly as its owner holds it (the others add zeros)."""
    mask = owned.reshape(-1, *(1,) * (gathered.ndim - 1))
    if gathered.dtype == jnp.bool_:
        return psum(jnp.where(mask, gathered, False).astype(jnp.int32)).astype(jnp.bool_)
    return psum(jnp.where(mask, gathered, jnp.zeros((), gathered.dtype)))


def _cohort_data(local: FederatedData, cohort_ids, owned, max_count: int, mine,
                 psum) -> FederatedData:
    """The examples of this device's slots, sent from their owners: slot s holds its client's
    n_i examples in rows [s M, s M + n_i) of a FederatedData whose clients are the slots."""
    count = local.count[cohort_ids]
    positions = local.offset[cohort_ids][:, None] + jnp.minimum(jnp.arange(max_count),
                                                                count[:, None] - 1)
    rows = local.index[jnp.where(owned[:, None], positions, 0)]
    send = lambda a: mine(_from_owners(a[rows], owned, psum))
    x, y = jax.tree.map(send, local.x), send(local.y)
    slots = y.shape[0]
    flat = lambda a: a.reshape(slots * max_count, *a.shape[2:])
    return FederatedData(x=jax.tree.map(flat, x), y=flat(y),
                         index=jnp.arange(slots * max_count, dtype=jnp.int32),
                         offset=jnp.arange(slots, dtype=jnp.int32) * max_count,
                         count=mine(count))


def _rows(state: RoundState):
    """(every client's algorithm state, {probe: every client's probe state}), stacked over N."""
    return state.client_states, {name: clients for name, (_, clients) in state.probes.items()}


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


def _cohort_runner(algorithm: Algorithm, probes: tuple[Probe, ...], work: LocalWork,
                   model: Model, augment, client_chunk: int, variable: bool,
                   clients_per_round: int, sharded: bool, loss_fn: Callable):
    """``run_clients(ids, data rows, rows, weights, joined, cohort size, w, server state, t, key,
    data, caps=None) -> (new rows, (summed message, summed probe outputs), per-client metrics)``
    for the slots given (all of them, or one device's share under shard_map). Slot s is client
    ``ids[s]`` (its identity: keys, ``ctx.client_id``) whose examples are client ``data rows[s]``
    of ``data`` (the population's, or the cohort's own copy on this device); ``caps[s]``: its
    local steps at most (a deadline's straggler); ``loss_fn``: the model's loss
    (``model_loss``). ``variable``: whether who joins varies (Bernoulli participation, a deadline,
    dropout): then a slot that did not join keeps its state and sends nothing, and the cohort
    size is a traced count."""

    def client_first_exchange(client_id, data_row, client_state, weight, joined, params,
                              server_state, round_index, cohort_size, key, data: FederatedData):
        ctx = client_context(work, loss_fn, data, data_row, client_id, client_state, weight,
                             params, server_state, round_index, cohort_size)
        ctx = ctx._replace(**dict(zip(("message_key", "shared_key"),
                                      message_keys(key, client_id))))
        message = algorithm.cohort_start(ctx)
        return message, message, ()     # kept per client (own_message) and summed

    def one_client(client_id, data_row, row, weight, own_message, cap, joined, params,
                   server_state, round_index, cohort_size, key, data: FederatedData,
                   cohort_message):
        client_state, probe_states = row
        ctx = client_context(work, loss_fn, data, data_row, client_id, client_state, weight,
                             params, server_state, round_index, cohort_size, cohort_message,
                             own_message)
        if cap is not None:                     # a straggler stopped by the deadline
            ctx = ctx._replace(num_steps=jnp.minimum(ctx.num_steps, cap).astype(jnp.int32))
        num_steps = ctx.num_steps
        start_key, batch_key, step_key = client_keys(key, client_id)
        ctx = ctx._replace(**dict(zip(("message_key", "shared_key"),
                                      message_keys(key, client_id))))

        def train(loss, tx, start, stream=0):   # stream 0: the round's own batches
            keys = (batch_key, step_key) if stream == 0 else stream_keys(
                batch_key, step_key, stream)
            return local_training(
                loss, tx, start, data, data_row, *keys, num_steps=num_steps,
                max_steps=work.max_steps, batch=work.batch, max_count=work.max_count,
                augment=augment, model=model, unroll=work.unroll)

        ctx = ctx._replace(train=lambda tx, start, stream, loss=None: train(
            loss_fn if loss is None else loss, tx, start, stream)[0])
        start = algorithm.client_start(ctx, start_key)
        end, losses = train(algorithm.client_loss(ctx, loss_fn), algorithm.client_tx(ctx), start)
        new_state, message = algorithm.client_end(ctx, start, end)
        metrics = {"loss": losses.sum() / jnp.maximum(num_steps, 1), "steps": num_steps,
                   **algorithm.client_metrics(ctx, start, end)}
        new_probe_states, probe_outputs = _probe_clients(probes, ctx, start, end, new_state,
                                                         probe_states)
        if algorithm.aggregate is not None:     # kept side by side, gathered like the metrics
            message, metrics = (), {**metrics, STACKED: message}
        return (new_state, new_probe_states), (message, probe_outputs), metrics

    def run_clients(ids, data_rows, rows, weights, joined, cohort_size, params, server_state,
                    round_index, key, data, caps=None):
        if not variable:
            cohort_size = clients_per_round          # static, as ClientContext promises
        shared = dict(params=params, server_state=server_state, round_index=round_index,
                      cohort_size=cohort_size, data=data)
        cohort_message = own_messages = ()
        if algorithm.cohort_start is not None:
            inputs = (ids, data_rows, rows[0], weights, joined)
            first, idle = joined_only(functools.partial(client_first_exchange, key=key,
                                                        **shared), inputs,
                                      None, variable)
            own_messages, cohort_message, _ = map_sum(first, inputs, client_chunk, idle)
            if sharded:
                cohort_message = jax.lax.psum(cohort_message, AXIS)
        inputs = (ids, data_rows, rows, weights, own_messages, caps, joined)
        fn, idle = joined_only(functools.partial(one_client, key=key,
                                                 cohort_message=cohort_message, **shared), inputs,
                               2, variable)
        return map_sum(fn, inputs, client_chunk, idle)

    return run_clients


def _probe_clients(probes, ctx, start, end, client_state, probe_states):
    """Every probe's client hook: ({name: new per-client state}, {name: output to sum})."""
    new_states, outputs = {}, {}
    for probe in probes:
        if probe.client is None:
            new_states[probe.name], outputs[probe.name] = probe_states[probe.name], ()
        else:
            new_states[probe.name], outputs[probe.name] = probe.client(
                ClientView(ctx, start, end, client_state, probe_states[probe.name]))
    return new_states, outputs


def _round_metrics(params, cohort, metrics: dict, variable: bool) -> dict:
    finite = jnp.all(jnp.array([jnp.all(jnp.isfinite(p)) for p in jax.tree.leaves(params)]))
    mean = (lambda values: jnp.sum(jnp.where(cohort.joined, values, 0))
            / jnp.maximum(cohort.size, 1)) \
        if variable else jnp.mean
    return {"train_loss": jnp.sum(cohort.weights * metrics.pop("loss")),
            "clients": jnp.where(cohort.joined, cohort.ids, -1),   # -1: a slot nobody took
            "params_finite": finite, "client_steps": metrics.pop("steps"),
            **{name: mean(values) for name, values in metrics.items()}}


def _population(work: LocalWork, loss_fn, data: FederatedData, aggregation: str, dtype,
                round_index, cohort_size) -> Population:
    """Every client, for probes and ``Algorithm.observe``: full local gradients and contexts."""
    weights = cohort_weights(data.count, aggregation, dtype)

    def gradient(client, params):
        return full_gradient(loss_fn, data, data.count[client], data.offset[client], params,
                             work.batch, work.max_count)

    def context(client, client_state, params, server_state):
        return client_context(work, loss_fn, data, client, client, client_state, weights[client],
                              params, server_state, round_index, cohort_size)

    return Population(num_clients=work.num_clients, counts=data.count, weights=weights,
                      gradient=gradient, context=context)


def _observe(algorithm, probes, state, new_state, cohort, probe_sums, probe_clients,
             population):
    """The algorithm's ``observe`` and every probe's server hook, after the server update:
    (the new state with their states, their metrics)."""
    view = RoundView(round=state.round, params=state.params, new_params=new_state.params,
                     server_state=new_state.server_state, client_states=new_state.client_states,
                     cohort=cohort, summed=(), state=(), client_probe_states=(),
                     population=population, algorithm=algorithm)
    metrics = {}
    if algorithm.observe is not None:
        server_state, metrics = algorithm.observe(view)
        new_state = new_state._replace(server_state=server_state)
        view = view._replace(server_state=server_state)
    probe_states = {}
    for probe in probes:
        server, _ = state.probes[probe.name]
        if probe.server is not None:
            server, probe_metrics = probe.server(view._replace(
                summed=probe_sums[probe.name], state=server,
                client_probe_states=probe_clients[probe.name]))
            metrics = _merge(metrics, probe_metrics)
        probe_states[probe.name] = (server, probe_clients[probe.name])
    return new_state._replace(probes=probe_states), metrics


def _merge(metrics: dict, more: dict) -> dict:
    clash = sorted(set(metrics) & set(more))
    if clash:
        raise FljaxError(f"two sources log the same round metric(s) {clash}; rename one")
    return {**metrics, **more}


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
