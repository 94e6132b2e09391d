"""Training a round's cohort: every sampled client's local work, summed or stacked messages.

``cohort_runner`` runs the clients of the slots it is given: side by side (``vmap``), one after
another (``lax.scan``) or in chunks of ``client_chunk``; ``cohort_on_devices`` deals the cohort
over a device mesh when the population is sharded (``shard_map``: the sampled clients' rows and
examples travel to their slots and back, messages are ``psum``-ed; ``fljax.core.placement``).
An algorithm with ``Algorithm.aggregate`` gets its clients' messages stacked (key ``STACKED`` of
the per-client outputs, gathered like the metrics) instead of summed: memory m x message.
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec as P

from fljax.algorithms.base import Algorithm
from fljax.core.clients import (LocalWork, client_context, joined_only, local_training, map_sum)
from fljax.core.placement import AXIS, data_specs, device_index
from fljax.data.federated import FederatedData
from fljax.models.model import Model
from fljax.population.cohort import client_keys, message_keys, stream_keys
from fljax.probes.base import ClientView, Probe

# The per-client output an Algorithm.aggregate collects (beside the metrics, gathered like them).
STACKED = "_cohort_messages"


def cohort_runner(algorithm: Algorithm, probes: tuple[Probe, ...], work: LocalWork,
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


def cohort_on_devices(run_clients, mesh: Mesh | None, work: LocalWork, bernoulli: bool):
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
