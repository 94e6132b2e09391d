"""One communication round as ONE compiled XLA program.

``round_fn = make_round(algorithm, model, data, ...)``; ``state, metrics = round_fn(state)``.
Inside the program: the cohort is sampled, each sampled client's state is gathered, every client runs
its local steps as a ``lax.scan``, clients run side by side (``vmap``), one after another
(``lax.scan`` over clients) or in chunks of ``client_chunk``, and over several devices the cohort is
split across a device mesh (``shard_map``; messages are ``psum``-ed). Then the server update and the
scatter of client states. The state is donated; randomness is ``fold_in(key, round)``, so a resumed
run repeats an uninterrupted one exactly.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fljax.algorithms.base import Algorithm, ClientContext, Params
from fljax.data.batching import batch_from_order, epoch_order_at, steps_per_epoch
from fljax.data.federated import FederatedData
from fljax.errors import FljaxError
from fljax.models.model import Model, cross_entropy

AGGREGATIONS = ("examples", "uniform")
PARTICIPATIONS = ("uniform", "bernoulli")


class RoundState(NamedTuple):
    round: jax.Array      # shape=(), int32: rounds done so far
    key: jax.Array        # shape=(2,), uint32: the experiment's root key
    params: Params        # global model w^t
    server_state: Any
    client_states: Any    # every client's state, stacked on a leading axis of num_clients


def init_state(algorithm: Algorithm, params: Params, num_clients: int, seed: int) -> RoundState:
    """Round 0: the server's and every client's initial state (as device arrays).

    The state owns fresh copies of ``params``: the round donates its state, and the caller's arrays
    stay usable (e.g. to start a second algorithm from the same initial model)."""
    params = jax.tree.map(lambda leaf: jnp.array(leaf, copy=True), params)
    client_state = algorithm.client_init(params)
    stacked = jax.tree.map(lambda x: jnp.broadcast_to(x, (num_clients, *x.shape)).copy(),
                           client_state)
    return RoundState(round=jnp.zeros((), jnp.int32), key=jax.random.PRNGKey(seed), params=params,
                      server_state=algorithm.server_init(params), client_states=stacked)


def round_key(key: jax.Array, round_index: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(cohort key, client key) of round t, derived from the root key only."""
    sample_key, client_key = jax.random.split(jax.random.fold_in(key, round_index))
    return sample_key, client_key


def client_keys(client_key: jax.Array, client_id: jax.Array) -> jax.Array:
    """(start, batch, step) keys of one client in a round: depend on the client id, not on the
    client's slot in the cohort or the device it runs on."""
    return jax.random.split(jax.random.fold_in(client_key, client_id), 3)


def sample_cohort(key: jax.Array, num_clients: int, cohort_size: int) -> jax.Array:
    """A uniformly random set of ``cohort_size`` distinct client ids, ascending."""
    return jnp.sort(jax.random.choice(key, num_clients, (cohort_size,), replace=False))


def bernoulli_cohort(key: jax.Array, num_clients: int, rate: float,
                     num_devices: int = 1) -> tuple[jax.Array, jax.Array]:
    """The FedDyn code's participation: each client joins independently with probability
    ``rate``, and the draw is repeated (the key folded with the attempt) while nobody joined.

    Returns (ids, joined) over all N clients: those who joined first, ascending, then the others;
    over D devices the order is dealt round-robin, so each device gets its share of them."""
    def draw(attempt):
        return jax.random.uniform(jax.random.fold_in(key, attempt), (num_clients,)) < rate

    _, joined = jax.lax.while_loop(lambda c: ~jnp.any(c[1]),
                                   lambda c: (c[0] + 1, draw(c[0] + 1)), (0, draw(0)))
    ids = jnp.argsort(~joined, stable=True).astype(jnp.int32)
    ids = ids.reshape(num_clients // num_devices, num_devices).T.reshape(-1)
    return ids, joined[ids]


def cohort_weights(counts: jax.Array, aggregation: str, dtype,
                   joined: jax.Array | None = None) -> jax.Array:
    """p_i: n_i / sum_S n_j ('examples') or 1/|S| ('uniform'); 0 where ``joined`` is False."""
    if joined is not None:
        joined = joined.astype(dtype)
        if aggregation == "uniform":
            return joined / joined.sum()
        counts = counts * joined
    elif aggregation == "uniform":
        return jnp.full(counts.shape, 1.0 / counts.shape[0], dtype)
    counts = counts.astype(dtype)
    return counts / counts.sum()


def local_training(loss_fn: Callable, tx: optax.GradientTransformation, start: Params,
                   data: FederatedData, client: jax.Array, batch_key: jax.Array,
                   step_key: jax.Array, *, num_steps: jax.Array, max_steps: int, batch: int,
                   max_count: int, augment: Callable | None = None) -> tuple[Params, jax.Array]:
    """(the client's model after ``num_steps`` steps of ``tx`` on ``loss_fn`` from ``start``, each
    step's loss). Step k reads batch k of the client's shuffled epochs (``fljax.data.batching``);
    the scan runs ``max_steps`` steps, and steps k >= num_steps change nothing (loss 0)."""
    count, offset = data.count[client], data.offset[client]
    grad_fn = jax.value_and_grad(loss_fn)

    def step(carry, k):
        local, opt_state, order = carry
        order = epoch_order_at(batch_key, count, k, batch, max_count, order)
        positions, mask = batch_from_order(order, count, k, batch, max_count)
        ids = data.index[offset + positions]
        x, y = data.x[ids], data.y[ids]
        rng = jax.random.fold_in(step_key, k)
        if augment is not None:
            x = augment(jax.random.fold_in(rng, 1), x)
        loss, grads = grad_fn(local, x, y, mask, rng)
        updates, new_opt_state = tx.update(grads, opt_state, local)
        new_local = optax.apply_updates(local, updates)
        active = k < num_steps
        keep = lambda new, old: jnp.where(active, new, old)
        carry = (jax.tree.map(keep, new_local, local),
                 jax.tree.map(keep, new_opt_state, opt_state), order)
        return carry, jnp.where(active, loss, 0.0)

    first = (start, tx.init(start), jnp.zeros(max_count, jnp.int32))
    (end, _, _), losses = jax.lax.scan(step, first, jnp.arange(max_steps))
    return end, losses


def _map_sum(fn, inputs, chunk: int, idle=None):
    """Apply ``fn`` to each row of ``inputs`` in chunks of ``chunk`` rows (vmap inside a scan over
    chunks); return (stacked first outputs, SUM over rows of the second output, stacked third).

    With ``idle`` (fn's outputs for a row that does no work), ``inputs[-1]`` is each row's active
    flag and a chunk without an active row calls ``idle`` instead (``lax.cond``: it costs nothing).
    """
    rows = jax.tree.leaves(inputs)[0].shape[0]
    one = jax.tree.map(lambda a: a[0], inputs)
    _, msg_shape, _ = jax.eval_shape(fn, *one)
    total = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), msg_shape)
    per_chunk = (lambda *xs: fn(*xs)) if chunk == 1 else jax.vmap(fn)

    def body(acc, xs):
        if chunk == 1:
            xs = jax.tree.map(lambda a: a[0], xs)
        if idle is None:
            state, msg, metrics = per_chunk(*xs)
        else:
            rest = idle if chunk == 1 else jax.vmap(idle)
            state, msg, metrics = jax.lax.cond(jnp.any(xs[-1]), lambda: per_chunk(*xs),
                                               lambda: rest(*xs))
        if chunk == 1:
            state, metrics = jax.tree.map(lambda a: a[None], (state, metrics))
        else:
            # A contraction with ones: XLA:CPU reduces a vmapped axis with sum() ~3x slower.
            msg = jax.tree.map(lambda a: jnp.tensordot(jnp.ones(chunk, a.dtype), a, axes=1), msg)
        return jax.tree.map(jnp.add, acc, msg), (state, metrics)

    chunks = jax.tree.map(lambda a: a.reshape(rows // chunk, chunk, *a.shape[1:]), inputs)
    total, (states, metrics) = jax.lax.scan(body, total, chunks)
    unchunk = lambda a: a.reshape(rows, *a.shape[2:])
    return jax.tree.map(unchunk, states), total, jax.tree.map(unchunk, metrics)


class RoundFunction:
    """``state, metrics = round_fn(state)``: a jitted, state-donating communication round."""

    def __init__(self, jitted, data: FederatedData, mesh: Mesh | None):
        self._jitted = jitted
        self._data = data
        self.mesh = mesh

    def __call__(self, state: RoundState) -> tuple[RoundState, dict]:
        return self._jitted(state, self._data)

    def place(self, state: RoundState) -> RoundState:
        """Put a state where the round expects it (replicated over the mesh, if any)."""
        if self.mesh is None:
            return state
        return jax.device_put(state, NamedSharding(self.mesh, P()))

    def compilations(self) -> int:
        """How many programs the round has compiled so far (1 after any number of calls)."""
        return self._jitted._cache_size()


def make_round(algorithm: Algorithm, model: Model, data: FederatedData, *, clients_per_round: int,
               batch_size: int | None, local_steps: int | None = None,
               local_epochs: int | None = None, aggregation: str = "examples",
               client_chunk: int | None = None, num_devices: int = 1,
               augment: Callable[[jax.Array, jax.Array], jax.Array] | None = None,
               participation: str = "uniform") -> RoundFunction:
    """Compile-ready round of ``algorithm`` training ``model`` on ``data``.

    Local work is exactly one of ``local_steps`` (K steps) or ``local_epochs`` (E passes, i.e.
    E*ceil(n_i/B) steps for client i; clients with fewer steps mask the rest). ``batch_size=None``
    is the full local dataset (FedSGD). ``client_chunk`` clients run side by side (vmap) at a time:
    1 is a sequential scan over clients (fastest on CPU), ``clients_per_round / num_devices`` is a
    full vmap (GPU); default: 1 on CPU, all on GPU. ``num_devices`` > 1 splits the cohort over
    that many devices. ``augment(key, x) -> x`` transforms each training batch.

    ``participation='uniform'`` samples ``clients_per_round`` distinct clients; 'bernoulli' lets
    each client join with probability C = clients_per_round / N (``bernoulli_cohort``; the FedDyn,
    FedBug and FL-Simulator code). The program then has a slot for every client and skips the
    slots of those who did not join: with ``client_chunk`` c, a round costs the ceil(|S|/c) chunks
    that hold someone (default c: 1 on CPU, the expected cohort per device on GPU).
    """
    num_clients = data.num_clients
    counts = np.asarray(data.count)
    max_count = int(counts.max())
    batch = max_count if batch_size is None else batch_size
    _check_round_args(num_clients, clients_per_round, batch, local_steps, local_epochs,
                      aggregation, num_devices, participation)
    bernoulli = participation == "bernoulli"
    slots = num_clients if bernoulli else clients_per_round
    if local_steps is not None:
        max_steps = local_steps
    else:
        max_steps = local_epochs * int(np.max((counts + batch - 1) // batch))
    per_device = slots // num_devices
    if client_chunk is None:
        wanted = 1 if jax.default_backend() == "cpu" else -(-clients_per_round // num_devices)
        client_chunk = max(c for c in range(1, wanted + 1) if per_device % c == 0)
    if client_chunk < 1 or per_device % client_chunk:
        raise FljaxError(f"client_chunk must divide the clients per device ({per_device}), got "
                         f"{client_chunk}")

    def model_loss(params, x, y, mask, rng):
        return cross_entropy(model.apply(params, x, train=True, rng=rng), y, mask)

    def context(client_id, client_state, weight, params, server_state, round_index, cohort_size,
                data: FederatedData, cohort_message=(), own_message=()) -> ClientContext:
        count = data.count[client_id]
        offset = data.offset[client_id]
        per_epoch = steps_per_epoch(count, batch)
        num_steps = local_steps if local_steps is not None else local_epochs * per_epoch

        def full_gradient(at_params):
            """grad of (1/n_i) sum_j loss(x_j): the client's data in order, in batches of B."""
            def body(total, b):
                slots = b * batch + jnp.arange(batch)
                mask = slots < count
                ids = data.index[offset + jnp.minimum(slots, count - 1)]
                scale = mask.sum() / count
                grads = jax.grad(model_loss)(at_params, data.x[ids], data.y[ids], mask, None)
                return jax.tree.map(lambda t, g: t + scale * g, total, grads), None

            zeros = jax.tree.map(jnp.zeros_like, at_params)
            total, _ = jax.lax.scan(body, zeros, jnp.arange(-(-max_count // batch)))
            return total

        return ClientContext(params=params, server_state=server_state, client_state=client_state,
                             round=round_index, client_id=client_id, weight=weight,
                             cohort_size=cohort_size, num_clients=num_clients,
                             num_examples=count,
                             mean_examples=data.count.mean(dtype=jax.tree.leaves(params)[0].dtype),
                             num_steps=jnp.asarray(num_steps, jnp.int32),
                             max_steps=max_steps,
                             steps_per_epoch=per_epoch, full_gradient=full_gradient,
                             cohort_message=cohort_message, own_message=own_message)

    def client_first_exchange(client_id, client_state, weight, joined, params, server_state,
                              round_index, cohort_size, data: FederatedData):
        ctx = context(client_id, client_state, weight, params, server_state, round_index,
                      cohort_size, data)
        message = algorithm.cohort_start(ctx)
        return message, message, ()     # kept per client (own_message) and summed

    def one_client(client_id, client_state, weight, own_message, joined, params, server_state,
                   round_index, cohort_size, key, data: FederatedData, cohort_message):
        ctx = context(client_id, client_state, weight, params, server_state, round_index,
                      cohort_size, data, cohort_message, own_message)
        num_steps = ctx.num_steps
        start_key, batch_key, step_key = client_keys(key, client_id)
        start = algorithm.client_start(ctx, start_key)
        end, losses = local_training(
            algorithm.client_loss(ctx, model_loss), algorithm.client_tx(ctx), start, data,
            client_id, batch_key, step_key, num_steps=num_steps, max_steps=max_steps,
            batch=batch, max_count=max_count, augment=augment)
        new_state, message = algorithm.client_end(ctx, start, end)
        metrics = {"loss": losses.sum() / jnp.maximum(num_steps, 1), "steps": num_steps,
                   **algorithm.client_metrics(ctx, start, end)}
        return new_state, message, metrics

    def joined_only(fn, inputs, keep_state: bool):
        """(fn, idle) for _map_sum over ``inputs``: fn's outputs where the client joined the round,
        else idle's: its state unchanged (``keep_state``; else zeros), zero message and metrics."""
        if not bernoulli:
            return fn, None
        state_shape, message_shape, metrics_shape = jax.eval_shape(
            fn, *jax.tree.map(lambda a: a[0], inputs))      # traced once, not per use of idle
        zeros = lambda tree: jax.tree.map(lambda t: jnp.zeros(t.shape, t.dtype), tree)

        def idle(*row):
            return (row[1] if keep_state else zeros(state_shape), zeros(message_shape),
                    zeros(metrics_shape))

        def masked(*row):   # a select, not a product: an idle slot's NaN never leaks
            return jax.tree.map(lambda a, b: jnp.where(row[-1], a, b), fn(*row), idle(*row))

        return masked, idle

    def run_clients(ids, states, weights, joined, cohort_size, params, server_state, round_index,
                    key, data):
        if not bernoulli:
            cohort_size = clients_per_round          # static, as ClientContext promises
        shared = dict(params=params, server_state=server_state, round_index=round_index,
                      cohort_size=cohort_size, data=data)
        cohort_message = own_messages = ()
        if algorithm.cohort_start is not None:
            inputs = (ids, states, weights, joined)
            first, idle = joined_only(functools.partial(client_first_exchange, **shared), inputs,
                                      False)
            own_messages, cohort_message, _ = _map_sum(first, inputs, client_chunk, idle)
            if num_devices > 1:
                cohort_message = jax.lax.psum(cohort_message, "clients")
        inputs = (ids, states, weights, own_messages, joined)
        fn, idle = joined_only(functools.partial(one_client, key=key,
                                                 cohort_message=cohort_message, **shared), inputs,
                               True)
        new_states, message_sum, metrics = _map_sum(fn, inputs, client_chunk, idle)
        if num_devices > 1:
            message_sum = jax.lax.psum(message_sum, "clients")
        return new_states, message_sum, metrics

    mesh = None
    if num_devices > 1:
        mesh = Mesh(np.array(jax.devices()[:num_devices]), ("clients",))
        run_clients = jax.shard_map(
            run_clients, mesh=mesh,
            in_specs=(P("clients"), P("clients"), P("clients"), P("clients"), P(), P(), P(),
                      P(), P(), P()),
            out_specs=(P("clients"), P(), P("clients")), check_vma=False)

    def round_fn(state: RoundState, data: FederatedData):
        sample_key, client_key = round_key(state.key, state.round)
        if bernoulli:
            cohort, joined = bernoulli_cohort(sample_key, num_clients,
                                              clients_per_round / num_clients, num_devices)
            cohort_size = joined.sum()
        else:
            cohort = sample_cohort(sample_key, num_clients, clients_per_round)
            joined, cohort_size = jnp.ones(slots, bool), jnp.asarray(clients_per_round)
        dtype = jax.tree.leaves(state.params)[0].dtype
        weights = cohort_weights(data.count[cohort], aggregation, dtype,
                                 joined if bernoulli else None)
        states = jax.tree.map(lambda a: a[cohort], state.client_states)
        new_states, message, metrics = run_clients(cohort, states, weights, joined, cohort_size,
                                                   state.params, state.server_state, state.round,
                                                   client_key, data)
        params, server_state = algorithm.server_update(state.params, state.server_state, message,
                                                       state.round)
        client_states = jax.tree.map(lambda a, new: a.at[cohort].set(new), state.client_states,
                                     new_states)
        new_state = RoundState(round=state.round + 1, key=state.key, params=params,
                               server_state=server_state, client_states=client_states)
        finite = jnp.all(jnp.array([jnp.all(jnp.isfinite(p)) for p in jax.tree.leaves(params)]))
        mean = (lambda values: jnp.sum(jnp.where(joined, values, 0)) / cohort_size) \
            if bernoulli else jnp.mean
        round_metrics = {"train_loss": jnp.sum(weights * metrics.pop("loss")),
                         "clients": jnp.where(joined, cohort, -1),   # -1: a slot nobody took
                         "params_finite": finite, "client_steps": metrics.pop("steps"),
                         **{name: mean(values) for name, values in metrics.items()}}
        return new_state, round_metrics

    if mesh is not None:
        data = jax.device_put(data, NamedSharding(mesh, P()))
    return RoundFunction(jax.jit(round_fn, donate_argnums=0), data, mesh)


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
    if participation == "bernoulli" and num_clients % num_devices:
        raise FljaxError(f"with bernoulli participation the number of clients ({num_clients}) "
                         f"must be a multiple of num_devices ({num_devices})")
    if participation == "uniform" and clients_per_round % num_devices:
        raise FljaxError(f"clients_per_round ({clients_per_round}) must be a multiple of "
                         f"num_devices ({num_devices})")
