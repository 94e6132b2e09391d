"""Ditto, pFedMe and FedEM equal float64 references written from their update rules.

Each reference is a numpy loop over the sampled clients and their local steps (randomness taken
from fljax's own sampling: ``client_schedule`` for the round's own batches, and the client's
independent draw number 1, ``stream_keys``, for the personal models' extra loops), with every update
rule written out as the algorithms' papers state it (module docstrings of fljax.algorithms.ditto,
.pfedme, .fedem). Partial participation (3 of 6 clients a round), so some clients train twice and
some never (their personal state stays the initial one). Then: the personalized evaluation scores
each user with its own model, and the CLI runs each algorithm.
"""

import functools
import json

import jax
import numpy as np
import optax
import pytest

from fljax.algorithms import local_sgd
from fljax.algorithms.ditto import ditto
from fljax.algorithms.fedem import fedem
from fljax.algorithms.pfedme import PersonalModel, pfedme
from fljax.runner.cli import main
from fljax.data.batching import client_batch
from fljax.data.federated import federate
from fljax.data.users import Users
from fljax.core.engine import client_keys, init_state, make_round, round_key, stream_keys
from fljax.errors import FljaxError
from fljax.models.mixture import mixture
from fljax.core.personalize import finetune_key, make_user_evaluator
from tests.reference import (global_norm, mlp_loss_and_grad, sgd_buffer, tree_map,
                             user_summaries)
from tests.test_drift_corrections import (EPOCHS, SEED, STEPS, assert_close, client_row,
                                          local_train, rounds_of, zeros)
from tests.test_fedavg_reference import NUM_CLASSES, SIZES, tiny_problem

ROUNDS, COHORT = 3, 3


# ------------------------------------------------------------------------------------------------
# float64 reference pieces

@functools.lru_cache(maxsize=None)
def _stream_schedule(sizes, t, cid, num_steps, batch, seed, stream):
    counts = np.array(sizes)
    with jax.enable_x64(True):
        _, client_key = round_key(jax.random.PRNGKey(seed), t)
        _, batch_key, step_key = client_keys(client_key, cid)
        key, _ = stream_keys(batch_key, step_key, stream)
        steps = []
        for k in range(num_steps):
            pos, mask = client_batch(key, int(counts[cid]), k, batch, int(counts.max()))
            steps.append((np.asarray(pos), np.asarray(mask, np.float64)))
    return steps


def stream_schedule(parts, t, cid, num_steps, batch, stream=1, seed=SEED):
    """Client ``cid``'s batches in round t of its extra local loop ``stream`` (``ctx.train``): the
    batch key ``stream_keys(batch_key, step_key, stream)[0]`` read as the round's own loop reads
    its batch key. ``stream=0`` gives the round's own batches (a check of the references)."""
    return _stream_schedule(tuple(len(p) for p in parts), t, cid, num_steps, batch, seed, stream)


def sgd_train(start, steps, grad, *, lr, momentum=0.0, weight_decay=0.0, clip=None):
    """``local_models``' torch SGD with the gradient ``grad(y, positions, mask)`` of any loss:
    d = clip(grad) + wd * y; buf = momentum * buf + d; y -= lr * buf."""
    local, buf = tree_map(np.copy, start), None
    for positions, mask in steps:
        buf = sgd_buffer(grad(local, positions, mask), local, buf, momentum=momentum,
                         weight_decay=weight_decay, clip=clip)
        local = tree_map(lambda a, b: a - lr * b, local, buf)
    return local


def examples_of(part, positions):
    return part[np.minimum(positions, len(part) - 1)]


def mlp_logits(params, x):
    h = np.maximum(x.reshape(len(x), -1) @ params["fc1"]["kernel"] + params["fc1"]["bias"], 0.0)
    return h @ params["fc2"]["kernel"] + params["fc2"]["bias"]


def log_softmax(z, axis=-1):
    z = z - z.max(axis=axis, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=axis, keepdims=True))


def per_example_ce(params, x, y):
    return -log_softmax(mlp_logits(params, x))[np.arange(len(y)), y]


def weighted_ce_grad(params, x, y, weights):
    """grad of sum_j weights_j CE(h(x_j), y_j), unnormalized (``mlp_loss_and_grad`` divides by
    max(sum of its mask, 1): undone here)."""
    _, g = mlp_loss_and_grad(params, x, y, weights)
    return tree_map(lambda a: a * max(weights.sum(), 1.0), g)


def component(components, m):
    return tree_map(lambda a: a[m], components)


def num_components(components):
    return jax.tree.leaves(components)[0].shape[0]


def responsibilities(components, log_pi, x, y):
    """q_j(m) = pi_m exp(-CE(h_m(x_j), y_j)) / sum_m' (...), shape [M, n]."""
    z = log_pi[:, None] - np.stack([per_example_ce(component(components, m), x, y)
                                    for m in range(num_components(components))])
    return np.exp(log_softmax(z, axis=0))


def mixture_logits(components, log_pi, x):
    """logsumexp_m (log pi_m + log_softmax(h_m(x))), as fljax.models.mixture."""
    z = np.stack([log_softmax(mlp_logits(component(components, m), x))
                  for m in range(num_components(components))]) + log_pi[:, None, None]
    top = z.max(axis=0)
    return top + np.log(np.exp(z - top).sum(axis=0))


# ------------------------------------------------------------------------------------------------
# the references

def ditto_reference(params, x, y, parts, *, lam, personal_lr, lr, lr_decay, momentum,
                    weight_decay, clip, stream=1, **sched):
    """Global model: FedAvg, w^{t+1} = w^t - sum_S p_k (w^t - y_k,K). Personal v_k (w^0 until it
    trains): when k is sampled in round t, as many steps on the independent draw of v <- v -
    eta_p decay^t [clip(g_k(v) + lam (v - w^t)) + wd v] (torch momentum)."""
    w = params
    personal = [params] * len(parts)
    for t, clients in rounds_of(parts, **sched):
        delta = zeros(w)
        for p, cid, steps in clients:
            sgd = dict(momentum=momentum, weight_decay=weight_decay, clip=clip)
            local = local_train(w, x, y, parts[cid], steps, lr=lr * lr_decay ** t, **sgd)
            anchor = w
            extra = stream_schedule(parts, t, cid, len(steps), sched["batch"], stream)
            personal[cid] = local_train(
                personal[cid], x, y, parts[cid], extra,
                lr=(lr if personal_lr is None else personal_lr) * lr_decay ** t,
                in_loss=lambda v: tree_map(lambda a, b: lam * (a - b), v, anchor), **sgd)
            delta = tree_map(lambda d, a, b: d + p * (a - b), delta, w, local)
        w = tree_map(np.subtract, w, delta)
    return w, personal


def pfedme_reference(params, x, y, parts, *, lam, inner_steps, inner_lr, beta, lr, lr_decay,
                     momentum, weight_decay, clip, stream=1, **sched):
    """Each local step on batch D: theta = w, K times theta -= eta_p (grad f(theta; D) +
    lam (theta - w)); then the local optimizer on lam (w - theta). Server: w^{t+1} = w^t -
    beta sum_S p_i (w^t - w_i,R). Personal model: R steps of SGD at eta_p on f(theta) +
    lam/2 ||theta - w_i,R||^2 from w_i,R on the independent draw."""
    eta_p = lr if inner_lr is None else inner_lr
    w = params
    personal = [PersonalModel(params, False)] * len(parts)
    for t, clients in rounds_of(parts, **sched):
        delta = zeros(w)
        for p, cid, steps in clients:
            part = parts[cid]

            def envelope_grad(local, positions, mask):
                ex = examples_of(part, positions)
                theta = local
                for _ in range(inner_steps):
                    _, g = mlp_loss_and_grad(theta, x[ex], y[ex], mask)
                    theta = tree_map(lambda a, b, c: a - eta_p * (b + lam * (a - c)),
                                     theta, g, local)
                return tree_map(lambda a, b: lam * (a - b), local, theta)

            local = sgd_train(w, steps, envelope_grad, lr=lr * lr_decay ** t, momentum=momentum,
                              weight_decay=weight_decay, clip=clip)
            extra = stream_schedule(parts, t, cid, len(steps), sched["batch"], stream)
            theta = local_train(local, x, y, part, extra, lr=eta_p, momentum=0.0,
                                weight_decay=0.0, clip=None,
                                in_loss=lambda v: tree_map(lambda a, b: lam * (a - b), v, local))
            personal[cid] = PersonalModel(theta, True)
            delta = tree_map(lambda d, a, b: d + p * (a - b), delta, w, local)
        w = tree_map(lambda a, d: a - beta * d, w, delta)
    return w, personal


def fedem_reference(params, x, y, parts, *, lr, lr_decay, momentum, weight_decay, clip,
                    use_q=True, m_step_prior="old", **sched):
    """E-step over the client's n_i examples with the components at w^t and the old pi:
    q_j(m) ∝ pi_m exp(-CE(h_m(x_j), y_j)), pi <- mean_j q_j. M-step: the local optimizer on
    (1/|B|) sum_{j in B} sum_m q_j(m) CE(h_m(y_m; x_j), y_j) (masked). Server: FedAvg of each
    component; the global log-weights are not averaged. Checks that the details matter:
    ``use_q=False`` weights the M-step by the old pi instead of q_j; ``m_step_prior="new"``
    computes the M-step's q_j with the E-step's new pi."""
    comps = params["components"]
    log_pis = [params["log_weights"]] * len(parts)
    for t, clients in rounds_of(parts, **sched):
        delta = zeros(comps)
        for p, cid, steps in clients:
            part, old, at_round = parts[cid], log_pis[cid], comps
            new_log_pi = np.log(responsibilities(at_round, old, x[part], y[part]).mean(axis=1))
            prior = old if m_step_prior == "old" else new_log_pi

            def m_step_grad(local, positions, mask):
                ex = examples_of(part, positions)
                q = responsibilities(at_round, prior, x[ex], y[ex])
                if not use_q:
                    q = np.broadcast_to(np.exp(prior)[:, None], q.shape)
                norm = max(mask.sum(), 1.0)
                grads = [weighted_ce_grad(component(local, m), x[ex], y[ex], q[m] * mask / norm)
                         for m in range(len(q))]
                return tree_map(lambda *g: np.stack(g), *grads)

            local = sgd_train(comps, steps, m_step_grad, lr=lr * lr_decay ** t,
                              momentum=momentum, weight_decay=weight_decay, clip=clip)
            log_pis[cid] = new_log_pi
            delta = tree_map(lambda d, a, b: d + p * (a - b), delta, comps, local)
        comps = tree_map(np.subtract, comps, delta)
    return {"components": comps, "log_weights": params["log_weights"]}, log_pis


# ------------------------------------------------------------------------------------------------
# running fljax in float64

def run(alg, model, *, batch, local_steps, local_epochs, aggregation, rounds=ROUNDS):
    """(initial float64 params, final state, x, y, parts); call inside jax.enable_x64(True)."""
    x, y, parts, _ = tiny_problem()
    params = jax.tree.map(lambda a: np.asarray(a, np.float64), model.init(jax.random.PRNGKey(1)))
    if model.component is not None:     # the mixture's log(1/M), exact in float64 (the init
        m = len(params["log_weights"])  # rounds it to float32: pi would not sum to 1)
        params["log_weights"] = np.full(m, -np.log(m))
    round_fn = make_round(alg, model, federate(x, y, parts, NUM_CLASSES),
                          clients_per_round=COHORT, batch_size=batch, local_steps=local_steps,
                          local_epochs=local_epochs, aggregation=aggregation, client_chunk=1)
    state = init_state(alg, params, len(parts), seed=SEED)
    for _ in range(rounds):
        state, _ = round_fn(state)
    return params, jax.tree.map(np.asarray, state), x, y, parts


def sampled_clients(parts, sched):
    """How often each client trained in the run."""
    times = np.zeros(len(parts), int)
    for _, clients in rounds_of(parts, **sched):
        for _, cid, _ in clients:
            times[cid] += 1
    return times


def split(case, extra):
    local = {k: case[k] for k in ("lr", "lr_decay", "momentum", "weight_decay", "clip")}
    sched = {k: case[k] for k in ("batch", "local_steps", "local_epochs", "aggregation")}
    rest = {k: case[k] for k in extra}
    return local, sched, rest


def make_local(lr, lr_decay, momentum, weight_decay, clip):
    return local_sgd(lr, round_decay=lr_decay, momentum=momentum, weight_decay=weight_decay,
                     clip_norm=clip)


def distance(a, b):
    return global_norm(tree_map(np.subtract, a, b))


# ------------------------------------------------------------------------------------------------
# Ditto

DITTO_CASES = {
    "steps_clip_momentum_examples": dict(**STEPS, lr=0.3, lr_decay=0.9, momentum=0.5,
                                         weight_decay=1e-2, clip=0.5, aggregation="examples",
                                         lam=0.7, personal_lr=0.2),
}


@functools.lru_cache(maxsize=None)
def run_ditto(case):
    local, sched, rest = split(DITTO_CASES[case], ("lam", "personal_lr"))
    with jax.enable_x64(True):
        alg = ditto(make_local(**local), **rest)
        params, state, x, y, parts = run(alg, alg_model(), **sched)
    return alg, params, state, x, y, parts


@functools.lru_cache(maxsize=None)
def alg_model(components=None):
    model = tiny_problem()[3]
    return model if components is None else mixture(model, components)


@pytest.mark.parametrize("case", sorted(DITTO_CASES))
def test_ditto_matches_float64_reference(case):
    _, params, state, x, y, parts = run_ditto(case)
    local, sched, rest = split(DITTO_CASES[case], ("lam", "personal_lr"))
    w, personal = ditto_reference(params, x, y, parts, **local, **sched, **rest)
    assert_close(state.params, w, rtol=1e-10, atol=1e-12)
    times = sampled_clients(parts, sched)
    assert times.min() == 0 and times.max() >= 2      # never-sampled and repeat clients
    for cid, v in enumerate(personal):
        assert_close(client_row(state.client_states, cid), v, rtol=1e-10, atol=1e-12)
        if times[cid] == 0:
            assert_close(client_row(state.client_states, cid), params, rtol=0, atol=0)
        else:
            assert distance(v, params) > 1e-3 and distance(v, w) > 1e-3
    # The case is sensitive to what it checks: the personal models on the round's own batches,
    # or without the pull toward w^t, end elsewhere.
    for change in (dict(stream=0), dict(lam=0.0)):
        _, other = ditto_reference(params, x, y, parts, **local, **sched, **rest | change)
        assert max(distance(a, b) for a, b in zip(other, personal)) > 1e-3, change


# ------------------------------------------------------------------------------------------------
# pFedMe

PFEDME_CASES = {
    "epochs_decay_uniform": dict(**EPOCHS, lr=0.3, lr_decay=0.9, momentum=0.0, weight_decay=0.0,
                                 clip=None, aggregation="uniform", lam=2.0, inner_steps=3,
                                 inner_lr=0.1, beta=0.8),
    "steps_clip_momentum_examples": dict(**STEPS, lr=0.3, lr_decay=1.0, momentum=0.5,
                                         weight_decay=1e-2, clip=0.3, aggregation="examples",
                                         lam=1.5, inner_steps=2, inner_lr=None, beta=1.3),
}
PFEDME_ARGS = ("lam", "inner_steps", "inner_lr", "beta")


@functools.lru_cache(maxsize=None)
def run_pfedme(case):
    local, sched, rest = split(PFEDME_CASES[case], PFEDME_ARGS)
    with jax.enable_x64(True):
        alg = pfedme(make_local(**local), **rest)
        params, state, x, y, parts = run(alg, alg_model(), **sched)
    return alg, params, state, x, y, parts


@pytest.mark.parametrize("case", sorted(PFEDME_CASES))
def test_pfedme_matches_float64_reference(case):
    _, params, state, x, y, parts = run_pfedme(case)
    local, sched, rest = split(PFEDME_CASES[case], PFEDME_ARGS)
    w, personal = pfedme_reference(params, x, y, parts, **local, **sched, **rest)
    assert_close(state.params, w, rtol=1e-10, atol=1e-12)
    assert distance(w, params) > 1e-2
    times = sampled_clients(parts, sched)
    assert times.min() == 0 and times.max() >= 2
    np.testing.assert_array_equal(state.client_states.trained, times > 0)
    for cid, mine in enumerate(personal):
        got = client_row(state.client_states.theta, cid)
        assert_close(got, mine.theta, rtol=1e-10, atol=1e-12)
        if times[cid] == 0:
            assert_close(got, params, rtol=0, atol=0)
    # The envelope mattered: FedAvg's local steps (lam * (w - theta) replaced by the loss
    # gradient) with the same server step end elsewhere.
    plain = pfedme_reference(params, x, y, parts, **local, **sched,
                             **rest | dict(inner_steps=1, lam=1.0 / (rest["inner_lr"]
                                                                   or local["lr"])))[0]
    assert distance(plain, w) > 1e-3
    # The personal models come from the independent draw: the round's own batches give others.
    _, other = pfedme_reference(params, x, y, parts, **local, **sched, **rest, stream=0)
    assert max(distance(a.theta, b.theta) for a, b in zip(other, personal)) > 1e-3


def test_pfedme_personal_model_is_the_global_model_until_a_client_trains():
    alg, params, state, *_ = run_pfedme("epochs_decay_uniform")
    for cid in range(len(SIZES)):
        mine = client_row(state.client_states, cid)
        with jax.enable_x64(True):
            got = alg.personal_model(state.params, state.server_state, mine)
        expected = mine.theta if mine.trained else state.params
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
            np.testing.assert_array_equal(a, b)


def test_pfedme_scored_globally_trains_the_same_global_model_and_keeps_no_personal_one():
    """score="global" (FederatedScope's pFedMe: every user scored with the fine-tuned global
    model) changes only the scoring: the same global model, no per-client state."""
    case = "epochs_decay_uniform"
    _, _, state, *_ = run_pfedme(case)
    local, sched, rest = split(PFEDME_CASES[case], PFEDME_ARGS)
    with jax.enable_x64(True):
        alg = pfedme(make_local(**local), **rest, score="global")
        _, global_state, *_ = run(alg, alg_model(), **sched)
    assert alg.personal_model is None
    assert jax.tree.leaves(global_state.client_states) == []
    for a, b in zip(jax.tree.leaves(global_state.params), jax.tree.leaves(state.params)):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(FljaxError, match="score must be one of"):
        pfedme(make_local(**local), score="theta")


# ------------------------------------------------------------------------------------------------
# FedEM

FEDEM_CASES = {
    "steps_three_components_clip_momentum_examples": dict(**STEPS, lr=0.3, lr_decay=0.9,
                                                          momentum=0.5, weight_decay=1e-2,
                                                          clip=0.5, aggregation="examples",
                                                          components=3),
}


@functools.lru_cache(maxsize=None)
def run_fedem(case):
    local, sched, rest = split(FEDEM_CASES[case], ("components",))
    model = alg_model(rest["components"])
    with jax.enable_x64(True):
        alg = fedem(make_local(**local), model, num_components=rest["components"])
        params, state, x, y, parts = run(alg, model, **sched)
    return alg, params, state, x, y, parts


@pytest.mark.parametrize("case", sorted(FEDEM_CASES))
def test_fedem_matches_float64_reference(case):
    _, params, state, x, y, parts = run_fedem(case)
    local, sched, rest = split(FEDEM_CASES[case], ("components",))
    m = rest["components"]
    w, log_pis = fedem_reference(params, x, y, parts, **local, **sched)
    assert_close(state.params, w, rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(state.params["log_weights"], np.full(m, -np.log(m)))
    assert distance(w, params) > 1e-2
    times = sampled_clients(parts, sched)
    assert times.min() == 0 and times.max() >= 2
    for cid, log_pi in enumerate(log_pis):
        np.testing.assert_allclose(state.client_states[cid], log_pi, rtol=1e-10, atol=1e-12)
        if times[cid] == 0:
            np.testing.assert_array_equal(state.client_states[cid], np.full(m, -np.log(m)))
        else:
            assert np.abs(np.exp(log_pi) - 1.0 / m).max() > 1e-3
            np.testing.assert_allclose(np.exp(log_pi).sum(), 1.0, rtol=1e-12)
    # The case is sensitive to what it checks: the M-step weighted by pi instead of q_j, or with
    # q_j from the new pi, ends elsewhere.
    for change in (dict(use_q=False), dict(m_step_prior="new")):
        other, _ = fedem_reference(params, x, y, parts, **local, **sched, **change)
        assert distance(other, w) > 1e-3, change


# ------------------------------------------------------------------------------------------------
# the personalized evaluation scores each user with its own model

NEW_USERS = 2


def evaluation_users(x, y, parts, seed=7):
    """The run's 6 clients as existing users (train: their parts; test: 4-6 fresh examples each)
    and 2 new users with fresh examples; (x, y, users)."""
    rng = np.random.default_rng(seed)
    num_users = len(parts) + NEW_USERS
    tests = [int(n) for n in rng.integers(4, 7, num_users)]
    new_train = [3, 5]
    extra = sum(tests) + sum(new_train)
    x_all = np.concatenate([x, rng.normal(size=(extra, *x.shape[1:]))])
    y_all = np.concatenate([y, rng.integers(0, NUM_CLASSES, extra)])
    ids = iter(np.split(len(x) + np.arange(extra), np.cumsum(tests + new_train)[:-1]))
    test = [next(ids) for _ in range(num_users)]
    train = list(parts) + [next(ids) for _ in range(NEW_USERS)]
    users = Users(existing=np.arange(len(parts)), new=len(parts) + np.arange(NEW_USERS),
                  train=train, val=[np.array([], int)] * num_users, test=test)
    return x_all, y_all, users


def user_scores(logits_of, x, y, users):
    """The evaluator's summaries of scoring user u with ``logits_of(u, x)``, in numpy."""
    acc, loss = [], []
    for u, test in enumerate(users.test):
        logits = logits_of(u, x[test])
        acc.append(np.mean(logits.argmax(1) == y[test]))
        loss.append(np.mean(-log_softmax(logits)[np.arange(len(test)), y[test]]))
    return user_summaries(acc, loss, users)


def ditto_logits(params, state, existing, *data):
    def logits(u, x):
        own = client_row(state.client_states, u) if u < existing else params   # new: w^0
        return mlp_logits(own, x)
    return logits


def pfedme_logits(params, state, existing, *data):
    def logits(u, x):
        own = client_row(state.client_states, u) if u < existing else PersonalModel(
            state.params, False)
        return mlp_logits(own.theta if own.trained else state.params, x)
    return logits


def fedem_logits(params, state, existing, x_all, y_all, users):
    """A user's mixture weights after one E-step on its training split (FedEM's ``adapt``) from
    its own (existing) or uniform (new) weights, under the global components."""
    m = len(state.params["log_weights"])
    components = state.params["components"]

    def logits(u, x):
        log_pi = state.client_states[u] if u < existing else np.full(m, -np.log(m))
        train = users.train[u]
        q = responsibilities(components, np.asarray(log_pi), x_all[train], y_all[train])
        return mixture_logits(components, np.log(q.mean(axis=1)), x)
    return logits


def global_logits(params, state, existing):
    if "components" in state.params:
        return lambda u, x: mixture_logits(state.params["components"],
                                           state.params["log_weights"], x)
    return lambda u, x: mlp_logits(state.params, x)


EVALUATED = {
    "ditto": (lambda: run_ditto("steps_clip_momentum_examples"), None, ditto_logits),
    "pfedme": (lambda: run_pfedme("epochs_decay_uniform"), None, pfedme_logits),
    "fedem": (lambda: run_fedem("steps_three_components_clip_momentum_examples"), 3,
              fedem_logits),
}


@pytest.mark.parametrize("name", sorted(EVALUATED))
def test_personalized_evaluation_scores_each_user_with_its_own_model(name):
    """finetune steps 0: existing user j is scored with client j's personal model, a new user with
    the personal model of the fresh state client_init(w^0) (Ditto: w^0; pFedMe: the global
    model; FedEM: the components with uniform weights), FedEM's after an E-step on the user's
    training split (``Algorithm.adapt``)."""
    trained, components, logits_of = EVALUATED[name]
    alg, params, state, x, y, parts = trained()
    x_all, y_all, users = evaluation_users(x, y, parts)
    with jax.enable_x64(True):
        evaluate = make_user_evaluator(
            alg_model(components), federate(x_all, y_all, users.train, NUM_CLASSES), users,
            finetune=local_sgd(0.1).chain(0), steps=0, batch_size=4,
            personal_model=alg.personal_model, fresh_state=alg.client_init(params),
            adapt=alg.adapt)
        got = evaluate(state.params, finetune_key(jax.random.PRNGKey(0), 3), state.server_state,
                       state.client_states)
    expected = user_scores(logits_of(params, state, len(parts), x_all, y_all, users), x_all,
                           y_all, users)
    assert set(got) == set(expected)
    for key, value in expected.items():
        np.testing.assert_allclose(got[key], value, rtol=1e-10, atol=1e-12, err_msg=key)
    # The personal models mattered: the global model scores the existing users differently.
    plain = user_scores(global_logits(params, state, len(parts)), x_all, y_all, users)
    assert abs(plain["existing_test_loss"] - got["existing_test_loss"]) > 1e-4
    if name in ("ditto", "fedem"):  # a new user holds w^0 / fits its own mixture weights
        assert abs(plain["new_test_loss"] - got["new_test_loss"]) > 1e-4
    else:
        np.testing.assert_allclose(got["new_test_loss"], plain["new_test_loss"], rtol=1e-10)


# ------------------------------------------------------------------------------------------------
# the CLI

CLI = ["--rounds", "2", "--eval-every", "2", "--num-clients", "6", "--clients-per-round", "2",
       "--partition", "iid", "--local-steps", "2", "--batch-size", "4", "--lr", "0.1",
       "--model", "linear", "--user-test-fraction", "0.2", "--new-users", "0.34", "--quiet"]
CLI_ARGS = {"ditto": {"lam": 0.5}, "pfedme": {"lam": 5.0, "inner_steps": 2, "inner_lr": 0.02},
            "fedem": {"num_components": 2}}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """A tiny .npz dataset (no sklearn import, no digits): 90 + 30 examples 4x4x1, 3 classes."""
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("data") / "tiny.npz"
    np.savez(path, x_train=rng.random((90, 4, 4, 1), np.float32), y_train=np.arange(90) % 3,
             x_test=rng.random((30, 4, 4, 1), np.float32), y_test=np.arange(30) % 3)
    return ["--dataset", str(path)]


@pytest.mark.parametrize("name", sorted(CLI_ARGS))
def test_cli_runs_each_personalized_algorithm(name, dataset, tmp_path, capsys):
    out = tmp_path / name
    argv = CLI + dataset + ["--algorithm", name, "--algorithm-args",
                            json.dumps(CLI_ARGS[name]), "--out-dir", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rounds = [r for r in records if r["kind"] == "round"]
    evals = [r for r in records if r["kind"] == "eval"]
    assert [r["round"] for r in rounds] == [1, 2] and [e["round"] for e in evals] == [2]
    assert all(np.isfinite(r["train_loss"]) for r in rounds)
    last = evals[-1]
    assert np.isfinite(last["loss"]) and 0.0 <= last["accuracy"] <= 1.0
    for group in ("existing", "new"):
        assert np.isfinite(last[f"{group}_test_loss"])
        assert 0.0 <= last[f"{group}_test_acc"] <= 1.0


@pytest.mark.parametrize("argv, message", [
    (["--algorithm", "ditto", "--algorithm-args", '{"lam": -1}'], "lam must be >= 0"),
    (["--algorithm", "ditto", "--algorithm-args", '{"personal_lr": 0}'],
     "personal_lr must be > 0"),
    (["--algorithm", "pfedme", "--algorithm-args", '{"inner_steps": 0}'],
     "inner_steps must be an integer >= 1"),
    (["--algorithm", "pfedme", "--algorithm-args", '{"lam": 0}'], "lam must be > 0"),
    (["--algorithm", "pfedme", "--algorithm-args", '{"beta": -0.5}'], "beta must be > 0"),
    (["--algorithm", "fedem", "--algorithm-args", '{"num_components": 0}'],
     "num_components must be an integer >= 1"),
])
def test_cli_rejects_bad_hyperparameters_in_one_line(argv, message, dataset, tmp_path, capsys):
    code = main(CLI + dataset + argv + ["--out-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("fljax: error: "), err
    assert message in err, err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


LOCAL = local_sgd(0.1)
BAD = {
    "ditto_negative_lam": (lambda: ditto(LOCAL, lam=-1.0), "lam must be >= 0"),
    "ditto_inf_lam": (lambda: ditto(LOCAL, lam=float("inf")), "lam must be >= 0"),
    "ditto_negative_personal_lr": (lambda: ditto(LOCAL, personal_lr=-0.1),
                                   "personal_lr must be > 0"),
    "ditto_optax_local": (lambda: ditto(optax.sgd(0.1)), "LocalSGD"),
    "pfedme_zero_lam": (lambda: pfedme(LOCAL, lam=0.0), "lam must be > 0"),
    "pfedme_nan_lam": (lambda: pfedme(LOCAL, lam=float("nan")), "lam must be > 0"),
    "pfedme_zero_inner_steps": (lambda: pfedme(LOCAL, inner_steps=0),
                                "inner_steps must be an integer >= 1"),
    "pfedme_bool_inner_steps": (lambda: pfedme(LOCAL, inner_steps=True),
                                "inner_steps must be an integer >= 1"),
    "pfedme_float_inner_steps": (lambda: pfedme(LOCAL, inner_steps=2.0),
                                 "inner_steps must be an integer >= 1"),
    "pfedme_zero_inner_lr": (lambda: pfedme(LOCAL, inner_lr=0.0), "inner_lr must be > 0"),
    "pfedme_zero_beta": (lambda: pfedme(LOCAL, beta=0.0), "beta must be > 0"),
    "pfedme_optax_local": (lambda: pfedme(optax.sgd(0.1)), "LocalSGD"),
    "fedem_plain_model": (lambda: fedem(LOCAL, alg_model(), num_components=2),
                          "fedem trains a mixture model"),
    "fedem_wrong_components": (lambda: fedem(LOCAL, alg_model(3), num_components=2),
                               r"num_components \(2\) differs from the mixture model's 3"),
    "mixture_zero_components": (lambda: mixture(alg_model(), 0),
                                "num_components must be an integer >= 1"),
    "mixture_of_a_mixture": (lambda: mixture(alg_model(2), 2), "already a mixture"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_hyperparameters_are_rejected(case):
    build, message = BAD[case]
    with pytest.raises(FljaxError, match=message) as e:
        build()
    assert len(str(e.value).splitlines()) == 1
