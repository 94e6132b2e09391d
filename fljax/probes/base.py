"""The probe interface: measurements computed inside the compiled round, opt-in.

A probe is a NamedTuple of pure functions (like an Algorithm), built by a factory::

    round_fn = fljax.make_round(algorithm, model, data, ..., probes=[
        fljax.probes.pseudo_gradient_diversity(), fljax.probes.cosine_previous()])
    state = round_fn.init_state(params, seed=0)        # holds every probe's state too
    state, metrics = round_fn(state)                   # metrics['pseudo_gradient_diversity'], ...

Inside round t, after the algorithm's own work, the engine calls for every sampled client

    state_i', out_i = probe.client(ClientView)        # out_i is SUMMED over the cohort (a psum
                                                      #   across devices), like a message

and once the server has updated the model

    server', metrics = probe.server(RoundView)        # sees the summed outputs, w^t and w^{t+1},
                                                      #   every client's state and the population

and, on the host at evaluations, ``probe.evaluate(EvalView) -> {name: float}`` (scores that need
the test or training set, e.g. the mean of every client's latest model). A probe's own state is
``init(params, num_clients) -> (server state, per-client states stacked over N)``; it lives in
``RoundState.probes[name]``, is checkpointed and resumes with the run.

With no probe the round is the same XLA program as without the feature (tests check its HLO).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from fljax.algorithms.base import Algorithm, ClientContext, Params


class ClientView(NamedTuple):
    """What a probe sees of one sampled client after its local training."""

    ctx: ClientContext       # the client's context (its algorithm state before the round)
    start: Params            # y_i,0, where local training started
    end: Params              # y_i,K, where it ended
    client_state: Any        # the algorithm's state for the client after the round
    state: Any               # this probe's state for the client, before the round

    @property
    def pseudo_gradient(self) -> Params:
        """Delta_i = w^t - y_i,K: the client's update against the broadcast model."""
        return jax.tree.map(jnp.subtract, self.ctx.params, self.end)


class Population(NamedTuple):
    """Every client of the federation, for probes that look beyond the cohort."""

    num_clients: int
    counts: jax.Array                                   # [N] n_k
    weights: jax.Array                                  # [N] p_k over ALL clients (aggregation)
    gradient: Callable[[jax.Array, Params], Params]     # (k, w) -> grad f_k(w), full local data
    context: Callable[..., ClientContext]               # (k, client state, w, server state) -> ctx


class RoundView(NamedTuple):
    """What a probe sees of a whole round, once the server has updated the model."""

    round: jax.Array          # t, the round just run
    params: Params            # w^t, the model broadcast in round t
    new_params: Params        # w^{t+1}
    server_state: Any         # the algorithm's server state after the round
    client_states: Any        # every client's algorithm state after the round, stacked over N
    cohort: Any               # the round's Cohort (ids, joined, weights, size)
    summed: Any               # this probe's client outputs summed over the cohort
    state: Any                # this probe's server state before the round
    client_probe_states: Any  # this probe's per-client states after the round, stacked over N
    population: Population
    algorithm: Algorithm

    def client_vectors(self, client: jax.Array) -> dict[str, Params]:
        """The algorithm's named vectors of client k's state after the round (FedDyn's local drift
        -alpha_k h_k, SCAFFOLD's control variate c_k); {} when it exposes none."""
        state = jax.tree.map(lambda a: a[client], self.client_states)
        ctx = self.population.context(client, state, self.new_params, self.server_state)
        return self.algorithm.client_vectors(ctx)


class EvalView(NamedTuple):
    """What a probe sees at an evaluation, on the host."""

    round: int
    state: Any                     # the RoundState
    probe_state: Any               # this probe's (server state, per-client states)
    model: Any                     # the Model
    algorithm: Algorithm
    data: Any                      # the training clients' FederatedData
    evaluate: Callable[[Params], dict]   # the test-set evaluator: params -> {'accuracy', 'loss'}
    out_dir: str | None            # the run directory (probes may write files there)


def no_state(params: Params, num_clients: int) -> tuple:
    """A stateless probe."""
    del params, num_clients
    return (), ()


class Probe(NamedTuple):
    """An in-round measurement. Build one with a factory (``fljax.probes.cosine_previous()``)."""

    name: str
    init: Callable[[Params, int], tuple[Any, Any]] = no_state
    client: Callable[[ClientView], tuple[Any, Any]] | None = None
    server: Callable[[RoundView], tuple[Any, dict[str, jax.Array]]] | None = None
    evaluate: Callable[[EvalView], dict[str, float]] | None = None
    eval_rounds: tuple[int, ...] = ()       # rounds after which the runner also evaluates


def squared_norm(tree: Params) -> jax.Array:
    """||tree||^2 over all leaves."""
    return sum(jnp.sum(jnp.square(leaf)) for leaf in jax.tree.leaves(tree))


def tree_dot(a: Params, b: Params) -> jax.Array:
    """<a, b> over all leaves."""
    return sum(jnp.vdot(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def stacked(n: int, tree: Params) -> Params:
    """``tree`` repeated on a new leading axis of size n (a per-client state of every client)."""
    return jax.tree.map(lambda x: jnp.broadcast_to(x, (n, *jnp.shape(x))).copy(), tree)
