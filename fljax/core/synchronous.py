"""The synchronous round: sample a cohort, train it, aggregate, update the server.

``synchronous_step(build, plan)`` is the function ``make_round`` compiles (alone, or over a batch
of runs): ``round_fn(state, data, mean_examples=None) -> (state, metrics)``. In order: the
algorithm is built from the run's traced hyperparameters; the cohort is drawn from
``fold_in(key, round)`` (``fljax.population.cohort``); with a clock, the deadline settles who
reports and how far stragglers got (``fljax.population.stragglers``); the cohort trains
(``fljax.core.cohort_training``); ``Algorithm.aggregate`` reduces stacked messages if the
algorithm asks for them, ``Algorithm.perturb`` adds its noise, ``Algorithm.server_update`` steps;
then ``Algorithm.observe`` and the probes' server hooks see every client (``Population``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fljax.algorithms.base import CohortMessages
from fljax.core.clients import LocalWork, client_context, client_steps, full_gradient
from fljax.core.cohort_training import STACKED, cohort_on_devices, cohort_runner
from fljax.core.placement import global_layout
from fljax.data.federated import FederatedData
from fljax.errors import FljaxError
from fljax.population.cohort import cohort_weights, draw_cohort, round_key, server_key
from fljax.population.stragglers import settle
from fljax.probes.base import Population, RoundView

# The fold_in data of Algorithm.aggregate's key, beside the server's SERVER_STREAM.
AGGREGATE_STREAM = 0xA66


def synchronous_step(build, plan):
    """``round_fn(state, data, mean_examples=None) -> (state, metrics)``: one synchronous round
    of the algorithm ``build(state.hparams)`` under ``plan`` (``fljax.core.plan.RoundPlan``);
    ``mean_examples``: a batched run's own mean client size, when the runs' splits differ."""

    def round_fn(state, data: FederatedData, mean_examples=None):
        algorithm = build(state.hparams)
        work = plan.work if mean_examples is None else plan.work._replace(
            mean_examples=mean_examples)
        run_clients = cohort_runner(algorithm, plan.probes, work, plan.model, plan.augment,
                                    plan.client_chunk, plan.variable, plan.sampled_per_round,
                                    plan.mesh is not None, plan.loss_fn)
        train_cohort = cohort_on_devices(run_clients, plan.mesh, work, plan.bernoulli)
        sample_key, client_key = round_key(state.key, state.round)
        dtype = jax.tree.leaves(state.params)[0].dtype
        cohort = draw_cohort(sample_key, data.count, clients_per_round=plan.sampled_per_round,
                             participation=plan.participation, aggregation=plan.aggregation,
                             dtype=dtype, num_devices=plan.population_devices)
        caps, timing_metrics, time = None, {}, state.clock
        if plan.clock is not None:
            if isinstance(state.clock, tuple):
                raise FljaxError("the round has a clock but the state holds no simulated time; "
                                 "build the state with round_fn.init_state(...)")
            sent = cohort.size                   # every sampled client was sent the model
            cohort, steps, elapsed = settle(
                plan.deadline, plan.clock, state.key, state.round, cohort,
                client_steps(work, data.count[cohort.ids]), data.count[cohort.ids],
                plan.aggregation, plan.clients_per_round)
            caps = steps if plan.capped else None
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
        round_metrics = {**_round_metrics(params, cohort, metrics, plan.variable),
                         **timing_metrics, **aggregate_metrics}
        if algorithm.observe is not None or plan.probes:
            if plan.mesh is not None:
                data = global_layout(data, plan.population_devices)
            population = _population(work, plan.loss_fn, data, plan.aggregation, dtype,
                                     state.round, cohort.size)
            new_state, observed = _observe(algorithm, plan.probes, state, new_state, cohort,
                                           probe_sums, probe_clients, population)
            round_metrics = _merge(round_metrics, observed)
        return new_state, round_metrics

    return round_fn


def _rows(state):
    """(every client's algorithm state, {probe: every client's probe state}), stacked over N."""
    return state.client_states, {name: clients for name, (_, clients) in state.probes.items()}


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
