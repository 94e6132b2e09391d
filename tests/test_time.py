"""Simulated time (``fljax.population.clock``, ``fljax.population.stragglers``, ``fljax.core.asynchronous``) against
independent references: durations recomputed in numpy from the same jax.random draws; deadlines,
dropout and over-selection by a float64 numpy FedAvg that follows the stragglers docstring;
FedBuff and FedAsync by a pure-Python event-queue simulator (a heap of (finish time, slot)) with
numpy local training from each finisher's stored start model on the batches of its start round.
Then: the refusals, resume and batched runs."""

import heapq
import json
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fljax import FljaxError, algorithms
from fljax.core.asynchronous import Asynchrony, replacements
from fljax.population.clock import CLOCK_STREAM, Clock, make_clock
from fljax.population.cohort import Cohort, client_keys, round_key, sample_cohort
from fljax.runner.config import ExperimentConfig
from fljax.data.batching import client_batch
from fljax.data.federated import federate
from fljax.core.engine import init_state, make_round
from fljax.core.runs import take
from fljax.population.stragglers import DROPOUT_STREAM, Deadline, sampled, settle
from fljax.runner.train import run
from tests.reference import global_norm, local_sgd, tree_map
from tests.test_dp import cli
from tests.test_fedavg_reference import NUM_CLASSES, tiny_problem
from tests.test_resume import assert_same, final_state, records
from tests.test_runs import splits

LR, BATCH = 0.3, 4
# jitted once: sample_cohort's fori_loop, run eagerly, compiles a program per call
cohort_of = jax.jit(sample_cohort, static_argnums=(1, 2))
replacements_of = jax.jit(replacements, static_argnums=(1, 3))


# ------------------------------------------------------------------------------------------------
# references


def durations_ref(key, rounds, ids, steps, sigma=0.0, jitter=0.0, step_times=None,
                  dtype=np.float64):
    """d_k,t = K tau_k exp(jitter e_k,t): tau_k = exp(sigma z_k) (or the trace's), z_k and e_k,t
    standard normals drawn (in ``dtype``) from fold_in(fold_in(key, CLOCK_STREAM), k) and
    fold_in(fold_in(fold_in(key, CLOCK_STREAM), t), k); the arithmetic in float64 numpy."""
    base = jax.random.fold_in(key, CLOCK_STREAM)
    ids = [int(i) for i in np.asarray(ids)]
    rounds = np.broadcast_to(np.asarray(rounds), (len(ids),))
    out = []
    for t, k, s in zip(rounds, ids, np.asarray(steps)):
        if step_times is None:
            z = float(jax.random.normal(jax.random.fold_in(base, k), (), dtype))
            tau = math.exp(sigma * z)
        else:
            tau = float(step_times[k])
        e = float(jax.random.normal(jax.random.fold_in(jax.random.fold_in(base, int(t)), k),
                                    (), dtype))
        out.append(float(s) * tau * math.exp(jitter * e))
    return np.array(out)


def vanished_ref(key, round_index, ids, q):
    """Dropout: client k of round t vanishes when its uniform draw (from the run's key, the clock
    and dropout streams, t and k) is below q."""
    base = jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(key, CLOCK_STREAM),
                                                 DROPOUT_STREAM), round_index)
    return np.array([float(jax.random.uniform(jax.random.fold_in(base, int(k)))) < q
                     for k in ids])


def local_model(w, x, y, parts, cid, client_key, num_steps, max_count, lr=LR, batch=BATCH):
    """Client ``cid``'s local SGD (float64 numpy) from ``w``: ``num_steps`` steps on the batches
    fljax draws for it from ``client_key`` (its round's client key)."""
    _, batch_key, _ = client_keys(client_key, cid)
    steps = [client_batch(batch_key, len(parts[cid]), k, batch, max_count)
             for k in range(num_steps)]
    return local_sgd(w, steps, parts[cid], x, y, lr)


def sync_reference(w, x, y, parts, key, rounds, *, m, sample, local_steps, sigma, jitter,
                   deadline: Deadline, aggregation):
    """FedAvg (server lr 1) under a clock and ``deadline``, written from the stragglers
    docstring: per round the cohort of ``sample`` clients, dropout, the m earliest kept, the
    deadline's cut (drop, or floor(K T / d) steps), weights over those who report, the round
    time. Returns (params, [per-round expected metrics])."""
    counts = np.array([len(p) for p in parts])
    n_clients, max_count = len(parts), int(counts.max())
    w = tree_map(lambda a: np.asarray(a, np.float64), w)
    sim_time, history = 0.0, []
    T = deadline.seconds
    for t in range(rounds):
        ids = np.asarray(cohort_of(round_key(key, t)[0], n_clients, sample))
        d = durations_ref(key, t, ids, [local_steps] * sample, sigma, jitter)
        report = np.ones(sample, bool)
        if deadline.dropout:
            report &= ~vanished_ref(key, t, ids, deadline.dropout)
        if deadline.over_selection:
            earliest = sorted((d[s], s) for s in range(sample) if report[s])[:m]
            report = np.isin(np.arange(sample), [s for _, s in earliest])
        steps = np.full(sample, local_steps)
        cut = np.zeros(sample, bool)
        if T is not None:
            late = d > T
            cut = report & late
            if deadline.stragglers == "partial":
                steps = np.where(late, np.floor(local_steps * (T / d)), local_steps).astype(int)
                report &= steps > 0
            else:
                report &= ~late
        elapsed = T if cut.any() else max([d[s] for s in range(sample) if report[s]] or [0.0])
        if aggregation == "examples":
            p = counts[ids] * report / max((counts[ids] * report).sum(), 1)
        else:
            p = report / max(report.sum(), 1)
        client_key = round_key(key, t)[1]
        new = w
        for s in np.flatnonzero(report):
            local = local_model(w, x, y, parts, int(ids[s]), client_key, int(steps[s]),
                                max_count)
            new = tree_map(lambda a, b, c: a - p[s] * (b - c), new, w, local)
        w = new
        sim_time += elapsed
        history.append(dict(clients=np.where(report, ids, -1), reported=int(report.sum()),
                            round_time=elapsed, sim_time=sim_time,
                            client_steps=np.where(report, steps, 0), cut=bool(cut.any()),
                            late=d > T if T is not None else np.zeros(sample, bool),
                            steps=steps, sampled=ids))
    return w, history


def staleness_ref(rule, tau, a, b):
    if rule == "constant":
        return 1.0
    if rule == "polynomial":
        return (1.0 + tau) ** -a
    return 1.0 if tau <= b else 1.0 / (a * (tau - b) + 1.0)


def event_queue(key, clock, num_clients, in_flight, buffer, steps_of, server_steps):
    """The asynchronous server as a discrete-event simulation: a heap of (finish time, slot);
    each server step pops the ``buffer`` earliest (ties: the lower slot), the clock moves to the
    last of them, and each freed slot (in slot order) gets a replacement drawn with round t+1's
    cohort key from the clients not in flight, starting now from version t+1. Returns, per
    step, the finishers (slot order) as (client, start version), and the time."""
    duration = lambda cid, version: float(clock.durations(
        key, jnp.asarray(version), jnp.asarray([cid], jnp.int32),
        jnp.asarray([steps_of(cid)], jnp.int32), jnp.float64)[0])
    first = [int(c) for c in cohort_of(round_key(key, 0)[0], num_clients, in_flight)]
    slots = [(cid, 0) for cid in first]                     # (client, start version)
    heap = [(0.0 + duration(cid, 0), s) for s, cid in enumerate(first)]
    heapq.heapify(heap)
    steps = []
    for t in range(server_steps):
        done = [heapq.heappop(heap) for _ in range(buffer)]
        now = done[-1][0]
        taken = sorted(s for _, s in done)
        steps.append(dict(finishers=[slots[s] for s in taken], now=now))
        busy = jnp.asarray([slots[s][0] for s in range(in_flight) if s not in taken], jnp.int32)
        fresh = replacements_of(round_key(key, t + 1)[0], num_clients, busy, buffer)
        for s, cid in zip(taken, (int(c) for c in fresh)):
            slots[s] = (cid, t + 1)
            heapq.heappush(heap, (now + duration(cid, t + 1), s))
    return steps


def async_reference(w, x, y, parts, key, steps, asynchrony: Asynchrony, steps_of):
    """The params after each server step of ``steps`` (``event_queue``'s), float64 numpy:
    finisher j trains from w^{tau_j} on round tau_j's batches; FedBuff: w - sum_j p_j s_j
    (w^{tau_j} - x_j), p_j = n_j / sum over the finishers; FedAsync: (1 - alpha s) w + alpha s
    x_j."""
    counts = np.array([len(p) for p in parts])
    max_count = int(counts.max())
    versions = [tree_map(lambda a: np.asarray(a, np.float64), w)]
    for t, step in enumerate(steps):
        w = versions[t]
        ids = [cid for cid, _ in step["finishers"]]
        p = counts[ids] / counts[ids].sum()
        new = w
        for weight, (cid, tau) in zip(p, step["finishers"]):
            start = versions[tau]
            local = local_model(start, x, y, parts, cid, round_key(key, tau)[1], steps_of(cid),
                                max_count)
            s = staleness_ref(asynchrony.staleness, t - tau, asynchrony.a, asynchrony.b)
            if asynchrony.rule == "fedbuff":
                new = tree_map(lambda a, b, c: a - weight * s * (b - c), new, start, local)
            else:
                rate = asynchrony.alpha * s
                new = tree_map(lambda a, c: (1 - rate) * a + rate * c, new, local)
        versions.append(new)
    return versions


SIZES10 = [5, 3, 6, 2, 4, 7, 3, 4, 2, 4]


def problem(sizes=None):
    """The 40 examples of test_fedavg_reference's tiny problem, split over ``sizes`` clients
    (default: its own 6), with float64 initial params."""
    x, y, parts, model = tiny_problem()
    if sizes is not None:
        perm = np.random.default_rng(7).permutation(len(y))
        parts = np.split(perm, np.cumsum(sizes)[:-1])
    params = jax.tree.map(lambda a: np.asarray(a, np.float64), model.init(jax.random.PRNGKey(1)))
    return x, y, parts, model, params


def one_line(error) -> str:
    text = str(error.value)
    assert "\n" not in text.strip(), text
    return text


def close(a, b, tol=1e-12):
    for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=tol, atol=tol)


# ------------------------------------------------------------------------------------------------
# the clock


@pytest.mark.parametrize("x64", [False, True], ids=["float32", "float64"])
def test_durations_are_steps_times_lognormal_speed_times_jitter(x64):
    with jax.enable_x64(x64):
        dtype = jnp.float64 if x64 else jnp.float32
        key = jax.random.PRNGKey(11)
        clock = make_clock(sigma=0.8, jitter=0.3)
        ids = jnp.asarray([3, 0, 7, 5], jnp.int32)
        steps = jnp.asarray([4, 1, 7, 2], jnp.int32)
        tol = 1e-12 if x64 else 2e-6
        got = clock.durations(key, jnp.asarray(5), ids, steps, dtype)
        assert got.dtype == dtype
        np.testing.assert_allclose(got, durations_ref(key, 5, ids, steps, 0.8, 0.3, dtype=dtype),
                                   rtol=tol)
        # one round per client (an asynchronous client's start version)
        rounds = jnp.asarray([0, 2, 2, 9], jnp.int32)
        np.testing.assert_allclose(clock.durations(key, rounds, ids, steps, dtype),
                                   durations_ref(key, rounds, ids, steps, 0.8, 0.3, dtype=dtype),
                                   rtol=tol)
        # a client's duration does not depend on who else is in the call, nor on its slot
        for i in range(4):
            alone = clock.durations(key, jnp.asarray(5), ids[i:i + 1], steps[i:i + 1], dtype)
            assert float(alone[0]) == float(got[i])
        others = clock.durations(key, jnp.asarray(5), jnp.asarray([9, 7, 1], jnp.int32),
                                 jnp.asarray([7, 7, 7], jnp.int32), dtype)
        assert float(others[1]) == float(got[2])
        # without jitter a client is steadily as slow in every round; sigma 0: 1 unit per step
        steady = make_clock(sigma=0.8)
        np.testing.assert_array_equal(steady.durations(key, jnp.asarray(0), ids, steps, dtype),
                                      steady.durations(key, jnp.asarray(6), ids, steps, dtype))
        np.testing.assert_array_equal(make_clock().durations(key, jnp.asarray(3), ids, steps,
                                                             dtype), np.asarray(steps, dtype))
        # the speeds are a seeded draw: another key, other speeds
        assert not np.allclose(got, clock.durations(jax.random.PRNGKey(12), jnp.asarray(5), ids,
                                                    steps, dtype))


def test_a_trace_gives_the_step_times(tmp_path):
    times = [0.5, 2.0, 1.25, 4.0, 0.75, 3.0]
    key = jax.random.PRNGKey(2)
    ids = jnp.asarray([5, 1, 2], jnp.int32)
    steps = jnp.asarray([2, 3, 1], jnp.int32)
    with jax.enable_x64(True):
        plain = make_clock(step_times=times, num_clients=6)
        np.testing.assert_array_equal(plain.durations(key, jnp.asarray(4), ids, steps, jnp.float64),
                                      [6.0, 6.0, 1.25])
        jittered = make_clock(step_times=times, jitter=0.25)
        np.testing.assert_allclose(
            jittered.durations(key, jnp.asarray(4), ids, steps, jnp.float64),
            durations_ref(key, 4, ids, steps, jitter=0.25, step_times=times), rtol=1e-12)
    # through the config: --clock '{"trace": FILE}'
    trace = tmp_path / "speeds.json"
    trace.write_text(json.dumps(times))
    config = ExperimentConfig(clock=json.dumps({"trace": str(trace), "jitter": 0.1}))
    assert config.options.clock == Clock(0.0, 0.1, tuple(times))


@pytest.mark.parametrize("make,message", [
    (lambda: make_clock(sigma=-1.0), "sigma must be >= 0 and finite, got -1.0"),
    (lambda: make_clock(jitter=float("inf")), "jitter must be >= 0 and finite"),
    (lambda: make_clock(step_times=[1.0, 0.0]), "step_times must be a list of positive"),
    (lambda: make_clock(step_times=[1.0, 2.0], sigma=0.5),
     "step_times (a trace) and sigma (drawn speeds) both set the clients' speeds; give one"),
    (lambda: make_clock(step_times=[1.0, 2.0, 3.0], num_clients=4),
     "step_times lists 3 clients; the run has 4"),
    (lambda: tiny_round(clock=Clock(step_times=(1.0, 2.0, 3.0))),
     "the clock's trace lists 3 clients' step times; the population has 6"),
    (lambda: tiny_round(clock="fast"), "clock must be a fljax.population.clock.Clock, got str"),
])
def test_bad_clocks_are_one_line_errors(make, message):
    with pytest.raises(FljaxError, match=re.escape(message)) as error:
        make()
    one_line(error)


def tiny_round(alg=None, **kwargs):
    x, y, parts, model, _ = problem()
    settings = {"clients_per_round": 3, "batch_size": BATCH, "local_steps": 2, **kwargs}
    return make_round(alg or algorithms.fedavg(algorithms.local_sgd(0.1)), model,
                      federate(x, y, parts, NUM_CLASSES), **settings)


# ------------------------------------------------------------------------------------------------
# deadlines, stragglers, dropout, over-selection: settle itself


def full_cohort(ids, counts, aggregation):
    n = len(ids)
    weights = counts / counts.sum() if aggregation == "examples" else np.full(n, 1.0 / n)
    return Cohort(jnp.asarray(ids, jnp.int32), jnp.ones(n, bool), jnp.asarray(weights),
                  jnp.asarray(n))


def renormalized(counts, report, aggregation):
    kept = (counts if aggregation == "examples" else np.ones(len(counts))) * report
    return kept / kept.sum() if kept.sum() else kept


@pytest.mark.parametrize("aggregation", ["examples", "uniform"])
def test_settle_drops_exactly_the_late_clients_and_renormalizes(aggregation):
    with jax.enable_x64(True):
        key, t = jax.random.PRNGKey(3), jnp.asarray(2)
        clock = make_clock(sigma=1.0, jitter=0.4)
        ids, steps = np.array([1, 3, 4, 6, 7]), jnp.asarray([3, 2, 3, 4, 1], jnp.int32)
        counts = np.array([5.0, 9.0, 2.0, 7.0, 4.0])
        d = durations_ref(key, 2, ids, steps, 1.0, 0.4)
        ordered = np.sort(d)
        cohort = full_cohort(ids, counts, aggregation)

        def settled(seconds, deadline=True):
            dl = Deadline(seconds) if deadline else None
            out, new_steps, elapsed = settle(dl, clock, key, t, cohort, steps,
                                             jnp.asarray(counts), aggregation, 5)
            np.testing.assert_array_equal(new_steps, steps)          # 'drop' cuts no steps
            return jax.device_get(out), float(elapsed)

        # two make it, three are cut: the round lasts until the deadline
        T = (ordered[1] + ordered[2]) / 2
        out, elapsed = settled(T)
        report = d <= T
        assert report.sum() == 2
        np.testing.assert_array_equal(out.joined, report)
        assert int(out.size) == 2 and elapsed == T
        np.testing.assert_allclose(out.weights, renormalized(counts, report, aggregation),
                                   rtol=1e-12)
        # nobody is cut: the round lasts until the slowest reports
        out, elapsed = settled(1.01 * ordered[-1])
        assert out.joined.all() and elapsed == pytest.approx(ordered[-1], rel=1e-12)
        np.testing.assert_allclose(out.weights, renormalized(counts, report | True, aggregation),
                                   rtol=1e-12)
        # nobody makes it: nothing reports, the weights are 0 and the round lasts T
        out, elapsed = settled(0.5 * ordered[0])
        assert not out.joined.any() and int(out.size) == 0 and elapsed == 0.5 * ordered[0]
        np.testing.assert_array_equal(out.weights, 0.0)
        # a clock without a deadline: everyone reports, the round lasts until the slowest
        out, elapsed = settled(None, deadline=False)
        assert out.joined.all() and elapsed == pytest.approx(ordered[-1], rel=1e-12)


def test_settle_partial_keeps_the_steps_finished_by_the_deadline():
    """Trace speeds, no jitter: d = K tau exactly; K = 3, T = 4.1: floor(3 * 4.1 / d)."""
    with jax.enable_x64(True):
        clock = make_clock(step_times=[0.5, 1.0, 2.0, 3.3, 10.0, 0.1])
        ids, counts = np.arange(5), np.array([3.0, 1.0, 4.0, 1.0, 5.0])
        steps = jnp.full(5, 3, jnp.int32)
        out, new_steps, elapsed = settle(Deadline(4.1, "partial"), clock, jax.random.PRNGKey(0),
                                         jnp.asarray(0), full_cohort(ids, counts, "uniform"),
                                         steps, jnp.asarray(counts), "uniform", 5)
        # d = 1.5, 3, 6, 9.9, 30: the first two finish, then 12.3/6, 12.3/9.9, 12.3/30 steps
        np.testing.assert_array_equal(new_steps, [3, 3, 2, 1, 0])
        np.testing.assert_array_equal(out.joined, [True, True, True, True, False])
        np.testing.assert_allclose(out.weights, [0.25, 0.25, 0.25, 0.25, 0.0], rtol=1e-15)
        assert float(elapsed) == 4.1


def test_settle_over_selection_keeps_the_earliest_m():
    with jax.enable_x64(True):
        key = jax.random.PRNGKey(8)
        clock = make_clock(sigma=1.2, jitter=0.5)
        ids, counts = np.array([0, 2, 3, 5, 8, 9]), np.array([4.0, 2.0, 6.0, 3.0, 5.0, 1.0])
        steps = jnp.asarray([2, 2, 3, 1, 2, 2], jnp.int32)
        d = durations_ref(key, 7, ids, steps, 1.2, 0.5)
        out, _, elapsed = settle(Deadline(over_selection=1.0), clock, key, jnp.asarray(7),
                                 full_cohort(ids, counts, "examples"), steps, jnp.asarray(counts),
                                 "examples", 3)
        report = np.isin(np.arange(6), np.argsort(d)[:3])
        np.testing.assert_array_equal(out.joined, report)
        np.testing.assert_allclose(out.weights, renormalized(counts, report, "examples"),
                                   rtol=1e-12)
        assert float(elapsed) == pytest.approx(np.sort(d)[2], rel=1e-12)
    # ceil(m (1 + o)) clients sampled, without float fuzz (10 * 1.3 = 13.000000000000002)
    assert [sampled(Deadline(over_selection=o), m) for m, o in
            ((10, 0.3), (4, 0.5), (3, 0.5), (5, 0.0), (7, 1.0))] == [13, 6, 5, 5, 14]
    assert sampled(None, 4) == 4


def test_dropout_removes_about_q_of_the_clients():
    """Over 2,500 keys x 40 clients (one vmapped program): the share that vanishes is q within
    4 standard errors, each client's own share within 5; with q = 0 nobody vanishes."""
    ids = np.arange(40)
    cohort = full_cohort(ids, np.ones(40), "uniform")
    steps, counts = jnp.full(40, 2, jnp.int32), jnp.ones(40)
    keys = jax.random.split(jax.random.PRNGKey(0), 2500)

    def joined(q):
        fn = lambda k: settle(Deadline(dropout=q), make_clock(sigma=0.5), k, jnp.asarray(3),
                              cohort, steps, counts, "uniform", 40)[0].joined
        return np.asarray(jax.jit(jax.vmap(fn))(keys))

    for q in (0.1, 0.3):
        gone = ~joined(q)
        assert abs(gone.mean() - q) < 4 * math.sqrt(q * (1 - q) / gone.size)
        assert np.all(np.abs(gone.mean(0) - q) < 5 * math.sqrt(q * (1 - q) / len(keys)))
    assert joined(0.0).all()
    # the draw is the documented one: the run's key, the round and the client id
    key = keys[17]
    np.testing.assert_array_equal(
        ~np.asarray(settle(Deadline(dropout=0.3), make_clock(), key, jnp.asarray(3), cohort,
                           steps, counts, "uniform", 40)[0].joined),
        vanished_ref(key, 3, ids, 0.3))


# ------------------------------------------------------------------------------------------------
# deadlines through make_round, against the float64 reference

SIGMA, JITTER = 1.0, 0.5
SYNC_CASES = {
    # round 1 cuts two of three, round 2 cuts none, round 4 keeps nobody
    "drop_examples": dict(seed=1, m=3, sample=3, local_steps=3, aggregation="examples",
                          deadline=Deadline(4.0, "drop")),
    # partial stragglers with 3 and 1 of 4 steps, and some with none (left out)
    "partial_uniform": dict(seed=5, m=4, sample=4, local_steps=4, aggregation="uniform",
                            deadline=Deadline(5.0, "partial")),
    # 5 sampled for 3, some vanish, the slowest on-time ones are not kept, stragglers dropped
    "dropout_over_selection": dict(seed=5, m=3, sample=5, local_steps=3, aggregation="examples",
                                   deadline=Deadline(4.0, "drop", dropout=0.25,
                                                     over_selection=0.5)),
}


def exercised(case, expected, key):
    """What makes each case a test of its feature (true of the reference's rounds)."""
    cut = [r["cut"] for r in expected]
    reported = [r["reported"] for r in expected]
    if case == "drop_examples":
        assert any(c and n for c, n in zip(cut, reported)) and not all(cut) and 0 in reported
    elif case == "partial_uniform":
        steps = np.concatenate([r["client_steps"] for r in expected])
        assert {1, 3} <= set(steps.tolist()) and not all(cut)
        assert any((r["steps"] == 0).any() for r in expected)
    else:
        vanished = [vanished_ref(key, t, r["sampled"], 0.25) for t, r in enumerate(expected)]
        assert any(v.any() for v in vanished)
        assert any(((r["clients"] < 0) & ~v & ~r["late"]).any()
                   for r, v in zip(expected, vanished))          # on time, not kept
        assert any(cut)


@pytest.mark.parametrize("case", sorted(SYNC_CASES))
def test_deadline_rounds_match_the_float64_reference(case):
    c = SYNC_CASES[case]
    x, y, parts, model, params = problem()
    rounds = 4
    with jax.enable_x64(True):
        key = jax.random.PRNGKey(c["seed"])
        final, expected = sync_reference(
            params, x, y, parts, key, rounds, m=c["m"], sample=c["sample"],
            local_steps=c["local_steps"], sigma=SIGMA, jitter=JITTER, deadline=c["deadline"],
            aggregation=c["aggregation"])
        exercised(case, expected, key)
        round_fn = make_round(algorithms.fedavg(algorithms.local_sgd(LR)), model,
                              federate(x, y, parts, NUM_CLASSES), clients_per_round=c["m"],
                              batch_size=BATCH, local_steps=c["local_steps"],
                              aggregation=c["aggregation"], clock=make_clock(SIGMA, JITTER),
                              deadline=c["deadline"])
        state = round_fn.init_state(params, c["seed"])
        for t in range(rounds):
            state, metrics = round_fn(state)
            got, want = jax.device_get(metrics), expected[t]
            np.testing.assert_array_equal(got["clients"], want["clients"])
            np.testing.assert_array_equal(got["client_steps"], want["client_steps"])
            assert int(got["reported"]) == want["reported"]
            np.testing.assert_allclose(got["round_time"], want["round_time"], rtol=1e-12)
            np.testing.assert_allclose(got["sim_time"], want["sim_time"], rtol=1e-12)
        np.testing.assert_allclose(state.clock, expected[-1]["sim_time"], rtol=1e-12)
        close(state.params, final)
    assert global_norm(tree_map(lambda a, b: np.asarray(a) - b, state.params, params)) > 1e-3


def test_a_client_that_does_not_report_keeps_its_state_and_sends_nothing():
    """SCAFFOLD (per-client control variates) with dropout, over-selection and a deadline, two
    rounds: in each, the clients that report get new states and every other client's state
    stays bit-identical (in round 2 also the non-zero state of a client of round 1 that is
    sampled again and does not report); corrupting the data of the sampled clients that did not
    report in round 1 changes nothing in round 1."""
    c = SYNC_CASES["dropout_over_selection"]
    x, y, parts, model, params = problem()
    with jax.enable_x64(True):
        key = jax.random.PRNGKey(c["seed"])
        _, expected = sync_reference(params, x, y, parts, key, 2, m=c["m"], sample=c["sample"],
                                     local_steps=c["local_steps"], sigma=SIGMA, jitter=JITTER,
                                     deadline=c["deadline"], aggregation="examples")
        reporting = [set(r["clients"][r["clients"] >= 0].tolist()) for r in expected]
        silent = [sorted(set(r["sampled"].tolist()) - rep) for r, rep in zip(expected, reporting)]
        assert all(reporting) and all(silent)
        assert reporting[0] & set(silent[1])      # trained in round 1, silent in round 2

        def train(x_data, y_data, rounds):
            alg = algorithms.scaffold(algorithms.local_sgd(LR))
            round_fn = make_round(alg, model, federate(x_data, y_data, parts, NUM_CLASSES),
                                  clients_per_round=c["m"], batch_size=BATCH,
                                  local_steps=c["local_steps"], clock=make_clock(SIGMA, JITTER),
                                  deadline=c["deadline"])
            state = round_fn.init_state(params, c["seed"])
            states, metrics = [jax.device_get(state)], []
            for _ in range(rounds):
                state, m = round_fn(state)
                states.append(jax.device_get(state))
                metrics.append(jax.device_get(m))
            return states, metrics

        states, metrics = train(x, y, 2)
        for t in range(2):
            np.testing.assert_array_equal(metrics[t]["clients"], expected[t]["clients"])
            for k in range(len(parts)):
                changed = [not np.array_equal(a[k], b[k]) for a, b in zip(
                    jax.tree.leaves(states[t].client_states),
                    jax.tree.leaves(states[t + 1].client_states))]
                assert all(changed) if k in reporting[t] else not any(changed), (t, k)
        x_bad, y_bad = x.copy(), y.copy()
        rng = np.random.default_rng(0)
        for k in silent[0]:
            x_bad[parts[k]] = 1e3 * rng.normal(size=x[parts[k]].shape)
            y_bad[parts[k]] = (y[parts[k]] + 1) % NUM_CLASSES
        corrupted, _ = train(x_bad, y_bad, 1)
    assert_same(states[1], corrupted[1])


# ------------------------------------------------------------------------------------------------
# asynchronous: FedBuff and FedAsync against the event-queue simulator

ASYNC_CASES = {
    "fedbuff_polynomial": dict(seed=4, asynchrony=Asynchrony(5, 2, "fedbuff", "polynomial",
                                                             a=0.5)),
    "fedasync_hinge": dict(seed=2, asynchrony=Asynchrony(3, 1, "fedasync", "hinge", a=1.0,
                                                         b=1.0, alpha=0.6)),
}


@pytest.mark.parametrize("case", sorted(ASYNC_CASES))
def test_async_server_steps_match_the_event_queue_and_float64_reference(case):
    c = ASYNC_CASES[case]
    asynchrony, server_steps = c["asynchrony"], 6
    x, y, parts, model, params = problem(SIZES10)
    steps_of = lambda cid: math.ceil(len(parts[cid]) / BATCH)      # one local epoch
    clock = make_clock(sigma=1.5, jitter=0.3)
    with jax.enable_x64(True):
        key = jax.random.PRNGKey(c["seed"])
        events = event_queue(key, clock, len(parts), asynchrony.in_flight, asynchrony.buffer,
                             steps_of, server_steps)
        versions = async_reference(params, x, y, parts, key, events, asynchrony, steps_of)
        round_fn = make_round(algorithms.fedavg(algorithms.local_sgd(LR)), model,
                              federate(x, y, parts, NUM_CLASSES),
                              clients_per_round=asynchrony.buffer, batch_size=BATCH,
                              local_epochs=1, clock=clock, asynchrony=asynchrony)
        state = round_fn.init_state(params, c["seed"])
        for t, event in enumerate(events):
            state, metrics = round_fn(state)
            got = jax.device_get(metrics)
            ids = [cid for cid, _ in event["finishers"]]
            stale = [t - tau for _, tau in event["finishers"]]
            np.testing.assert_array_equal(got["clients"], ids)
            np.testing.assert_array_equal(got["client_steps"], [steps_of(i) for i in ids])
            assert float(got["staleness"]) == np.mean(stale)
            assert int(got["max_staleness"]) == max(stale)
            np.testing.assert_allclose(got["sim_time"], event["now"], rtol=1e-12)
            close(state.params, versions[t + 1])
    # the run was asynchronous: stale updates (hinge: past b = 1, so down-weighted)
    stale = [t - tau for t, e in enumerate(events) for _, tau in e["finishers"]]
    assert max(stale) >= 2 and min(stale) == 0


def test_fedbuff_with_all_in_flight_in_the_buffer_is_synchronous_fedavg():
    """M = K, constant staleness: every client starts and ends in the same server step, which
    is synchronous FedAvg's round (the same cohorts, the same params to 1e-12)."""
    x, y, parts, model, params = problem(SIZES10)
    data = federate(x, y, parts, NUM_CLASSES)
    settings = dict(clients_per_round=4, batch_size=BATCH, local_epochs=1)
    alg = algorithms.fedavg(algorithms.local_sgd(LR))
    with jax.enable_x64(True):
        sync = make_round(alg, model, data, **settings)
        buffered = make_round(alg, model, data, **settings, clock=make_clock(sigma=1.0),
                              asynchrony=Asynchrony(4, 4, staleness="constant"))
        a, b = sync.init_state(params, 9), buffered.init_state(params, 9)
        for _ in range(3):
            a, ma = sync(a)
            b, mb = buffered(b)
            np.testing.assert_array_equal(ma["clients"], mb["clients"])
            assert int(mb["max_staleness"]) == 0
            for u, v in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)):
                assert np.max(np.abs(np.asarray(u) - np.asarray(v))) <= 1e-12


# ------------------------------------------------------------------------------------------------
# refusals


@pytest.mark.parametrize("make,message", [
    (lambda l: algorithms.scaffold(l), "scaffold keeps per-client state, which cannot run "
                                       "asynchronously"),
    (lambda l: algorithms.feddyn(l), "keeps per-client state, which cannot run asynchronously"),
    (lambda l: algorithms.ditto(l), "keeps per-client state, which cannot run asynchronously"),
    (lambda l: algorithms.fedga(l), "needs a first exchange with the whole cohort "
                                    "(cohort_start)"),
    (lambda l: algorithms.dp(algorithms.fedavg(l), 0.5, 1.0, 2),
     "adds server noise calibrated to a cohort"),
])
def test_algorithms_that_cannot_run_asynchronously_are_refused(make, message):
    round_fn = tiny_round(make(algorithms.local_sgd(0.1)), clients_per_round=2,
                          clock=make_clock(sigma=1.0), asynchrony=Asynchrony(3, 2))
    state = round_fn.init_state(problem()[-1], 0)
    with pytest.raises(FljaxError, match=re.escape(message)) as error:
        round_fn(state)
    one_line(error)


CLOCK = make_clock(sigma=1.0)


@pytest.mark.parametrize("kwargs,message", [
    (dict(clock=CLOCK, asynchrony=Asynchrony(3, 4)),
     "buffer (4) must be at most in_flight (3)"),
    (dict(clock=CLOCK, asynchrony=Asynchrony(3, 2, rule="fedasync")),
     "fedasync updates the model with each finisher: buffer must be 1, got 2"),
    (dict(clock=CLOCK, asynchrony=Asynchrony(7, 2)),
     "in_flight (7) must be at most the number of clients (6)"),
    (dict(clock=CLOCK, asynchrony=Asynchrony(3, 1, staleness="exponential")),
     "staleness must be one of"),
    (dict(clock=CLOCK, asynchrony=Asynchrony(3, 2), participation="bernoulli"),
     "asynchronous training does not compose with Bernoulli participation"),
    (dict(deadline=Deadline(5.0)), "a deadline or asynchrony needs a clock"),
    (dict(asynchrony=Asynchrony(3, 2)), "a deadline or asynchrony needs a clock"),
    (dict(clock=CLOCK, deadline=Deadline(5.0), asynchrony=Asynchrony(3, 2)),
     "give a deadline or asynchrony, not both"),
    (dict(clock=CLOCK, deadline=Deadline(0.0)), "deadline must be > 0"),
    (dict(clock=CLOCK, deadline=Deadline(5.0, "wait")), "stragglers must be one of"),
    (dict(clock=CLOCK, deadline=Deadline(dropout=1.0)), "dropout must be in [0, 1)"),
    (dict(clock=CLOCK, deadline=Deadline(over_selection=0.5), participation="bernoulli"),
     "Bernoulli participation samples no fixed number"),
])
def test_bad_timing_settings_are_one_line_errors(kwargs, message):
    with pytest.raises(FljaxError, match=re.escape(message)) as error:
        tiny_round(**kwargs)
    one_line(error)


@pytest.mark.parametrize("timing", [dict(deadline=Deadline(5.0)),
                                    dict(asynchrony=Asynchrony(3, 2))])
def test_a_state_without_simulated_time_is_refused(timing):
    alg = algorithms.fedavg(algorithms.local_sgd(0.1))
    round_fn = tiny_round(alg, clock=CLOCK, **timing)
    state = init_state(alg, problem()[-1], 6, 0)              # built without the round's clock
    with pytest.raises(FljaxError, match=re.escape("build the state with "
                                                   "round_fn.init_state(...)")) as error:
        round_fn(state)
    one_line(error)


def test_cli_bad_timing_input_is_one_line_exit_2(tmp_path):
    done = cli("--rounds", "2", "--out-dir", str(tmp_path / "run"), "--asynchrony",
               '{"in_flight": 3, "buffer": 4}', "--clock", '{"sigma": 1.0}', cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "buffer (4) must be at most in_flight (3)" in lines[0], \
        done.stderr


# ------------------------------------------------------------------------------------------------
# resume and batched runs

TIMED_RUNS = {
    "fedbuff": dict(clock='{"sigma": 1.0, "jitter": 0.2}',
                    asynchrony='{"in_flight": 5, "buffer": 2, "staleness": "polynomial"}'),
    "deadline": dict(clock='{"sigma": 1.0, "jitter": 0.2}',
                     deadline='{"seconds": 3, "stragglers": "partial", "dropout": 0.2, '
                              '"over_selection": 0.5}'),
}


@pytest.mark.parametrize("name", sorted(TIMED_RUNS))
def test_timed_run_then_resume_is_bit_identical(name, tmp_path):
    base = dict(rounds=4, eval_every=2, checkpoint_every=2, num_clients=8, clients_per_round=3,
                model="linear", local_steps=2, local_epochs=None, batch_size=8)
    full = ExperimentConfig(**base, **TIMED_RUNS[name], out_dir=str(tmp_path / "full"))
    run(full, progress=False)
    half = full.replace(out_dir=str(tmp_path / "half"), rounds=2)
    run(half, progress=False)
    resumed = half.replace(rounds=4)
    run(resumed, progress=False)
    logged = records(full.out_dir)
    assert logged == records(resumed.out_dir)
    state = final_state(full.out_dir, full)
    assert_same(state, final_state(resumed.out_dir, resumed))
    rounds = [r for r in logged if r["kind"] == "round"]
    times = [r["sim_time"] for r in rounds]
    assert len(rounds) == 4 and times == sorted(times) and times[0] > 0
    assert [r["sim_time"] for r in logged if r["kind"] == "eval"] == [times[1], times[3]]
    now = state.clock.now if name == "fedbuff" else state.clock
    assert float(now) == pytest.approx(times[-1], rel=1e-6)
    if name == "fedbuff":
        assert all(len(r["clients"]) == 2 for r in rounds)
        assert max(r["max_staleness"] for r in rounds) >= 1
    else:
        assert all(r["round_time"] <= 3 for r in rounds)
        # every sampled client (5 = 3 x 1.5) was sent the model; those that reported sent one
        model_bits = 32 * sum(a.size for a in jax.tree.leaves(state.params))
        assert all(r["sampled"] == 5 for r in rounds)
        assert all(r["bits_down"] == 5 * model_bits for r in rounds)
        assert [r["bits_up"] for r in rounds] == [len(r["clients"]) * model_bits
                                                  for r in rounds]   # the clients that reported
        assert any(len(r["clients"]) < 5 for r in rounds)


def compare_timed(settings, rounds=3, run_chunk=None):
    """Two runs (own seeds, splits and models) batched and alone: the same metrics every round
    and the same final state, simulated time included."""
    seeds = [0, 1]
    with jax.enable_x64(True):
        x, y, _, model = tiny_problem()
        datas = [federate(x, y, splits(s), NUM_CLASSES) for s in seeds]
        params = [jax.tree.map(lambda a: a.astype(jnp.float64), model.init(jax.random.PRNGKey(s)))
                  for s in seeds]
        alg = algorithms.fedavg(algorithms.local_sgd(LR))
        batched = make_round(alg, model, datas, runs=2, run_chunk=run_chunk, **settings)
        state = batched.init_state(params, seeds)
        history = []
        for _ in range(rounds):
            state, metrics = batched(state)
            history.append(jax.device_get(metrics))
        for r in range(2):
            alone = make_round(alg, model, datas[r], **settings)
            own = alone.init_state(params[r], seeds[r])
            for t in range(rounds):
                own, metrics = alone(own)
                assert set(metrics) == set(history[t])
                for name, value in metrics.items():
                    np.testing.assert_allclose(history[t][name][r], value, rtol=1e-12,
                                               atol=1e-12, err_msg=name)
            close(take(state, r), own)
    return history


def test_batched_runs_with_a_deadline_equal_each_run_alone():
    history = compare_timed(dict(clients_per_round=3, batch_size=BATCH, local_steps=3,
                                 clock=make_clock(sigma=1.0, jitter=0.5),
                                 deadline=Deadline(4.0, "partial", dropout=0.2,
                                                   over_selection=0.5)))
    assert any((h["clients"] < 0).any() for h in history)           # someone did not report


def test_batched_asynchronous_runs_equal_each_run_alone():
    """Side by side (vmap; the deadline test above runs the CPU default, a scan over runs)."""
    history = compare_timed(dict(clients_per_round=2, batch_size=BATCH, local_epochs=1,
                                 clock=make_clock(sigma=1.5, jitter=0.3),
                                 asynchrony=Asynchrony(4, 2)), rounds=4, run_chunk=2)
    assert max(int(h["max_staleness"].max()) for h in history) >= 1
