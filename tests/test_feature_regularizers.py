"""FedSAM, MOON, FedNTD and FedDecorr against float64 references written from the papers' equations.

Each reference loss below is written in jax.numpy straight from the equations (and the official
code's choices: unbiased variance, 'batchmean', cosine logits with label 0), differentiated with
jax.grad in float64 and stepped in a Python loop over rounds, clients and local steps, with the
cohorts and batches of tests/reference.client_schedule. Padded examples of a partial last batch are
simply DROPPED before the reference loss is called (the batch torch's DataLoader would yield), so
the masking of the implementation is checked, not copied. FedSAM's reference is the explicit
two-pass SAM step on the hand-written numpy gradients of tests/reference.py.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fljax import algorithms
from fljax.algorithms.feddecorr import feddecorr
from fljax.algorithms.fedntd import fedntd
from fljax.algorithms.fedsam import fedsam, sam_loss
from fljax.algorithms.moon import moon
from fljax.data.federated import federate
from fljax.core.engine import init_state, make_round
from fljax.errors import FljaxError
from fljax.models import MLP, ConvNet, cross_entropy, from_module, num_params
from fljax.models.heads import with_projection_head
from tests.reference import client_schedule, global_norm, mlp_loss_and_grad, tree_map

SIZES = [7, 3, 12, 5, 9, 4]
NUM_CLASSES = 3
SEED = 3
ROUNDS = 3
COHORT = 3

# Local-training settings; "epochs" has partial last batches (sizes 7, 3, 12, 5, 9, 4 with B = 5).
CASES = {
    "steps": dict(batch=4, local_steps=3, local_epochs=None, lr=0.3, lr_decay=1.0, momentum=0.0,
                  weight_decay=0.0, clip=None, server_lr=1.0, aggregation="examples", chunk=1),
    "epochs_momentum_clip": dict(batch=5, local_steps=None, local_epochs=2, lr=0.1, lr_decay=0.9,
                                 momentum=0.9, weight_decay=1e-2, clip=0.7, server_lr=0.8,
                                 aggregation="uniform", chunk=3),
}


def tiny_problem(seed=0, projection=False):
    rng = np.random.default_rng(seed)
    n = sum(SIZES)
    x = rng.normal(size=(n, 2, 2, 1))
    y = rng.integers(0, NUM_CLASSES, n)
    parts = np.split(rng.permutation(n), np.cumsum(SIZES)[:-1])
    model = from_module("tiny", MLP(hidden=(5,), num_classes=NUM_CLASSES), (2, 2, 1), NUM_CLASSES)
    if projection:
        model = with_projection_head(model, out_dim=4)
    return x, y, parts, model


def f64(tree):
    return tree_map(lambda a: np.asarray(a, np.float64), tree)


# ---------------------------------------------------------------- float64 reference machinery

@functools.lru_cache(maxsize=None)
def schedule(t, batch, local_steps, local_epochs):
    """[(client id, [(positions, mask), ...]), ...] of round t, as fljax samples them."""
    counts = np.array(SIZES)
    return list(client_schedule(jax.random.PRNGKey(SEED), t, COHORT, counts, batch, local_steps,
                                local_epochs, counts.max()))


def reference_run(params, x, y, parts, c, grad_of):
    """FedAvg's outer loop (as tests/test_fedavg_reference.py) with local gradients from
    ``grad_of(local, xb, yb, w=, t=, cid=, prev=)`` on the VALID examples of each batch; ``prev``
    maps a client to its model at the end of its last round (MOON's state)."""
    w = f64(params)
    counts = np.array([len(p) for p in parts])
    assert list(counts) == SIZES
    prev = {}
    for t in range(ROUNDS):
        cohort = schedule(t, c["batch"], c["local_steps"], c["local_epochs"])
        ids = [cid for cid, _ in cohort]
        p = (counts[ids] / counts[ids].sum() if c["aggregation"] == "examples"
             else np.full(COHORT, 1.0 / COHORT))
        delta = tree_map(np.zeros_like, w)
        finished = {}
        for weight, (cid, steps) in zip(p, cohort):
            local, buf = tree_map(np.copy, w), None
            for positions, mask in steps:
                examples = parts[cid][np.minimum(positions, counts[cid] - 1)][mask > 0]
                g = grad_of(local, x[examples], y[examples], w=w, t=t, cid=cid, prev=prev)
                if c["clip"] is not None:
                    g = tree_map(lambda a: a * c["clip"] / max(global_norm(g), c["clip"]), g)
                g = tree_map(lambda a, b: a + c["weight_decay"] * b, g, local)
                buf = g if buf is None else tree_map(lambda b, a: c["momentum"] * b + a, buf, g)
                local = tree_map(lambda a, b: a - c["lr"] * c["lr_decay"] ** t * b, local, buf)
            finished[cid] = local
            delta = tree_map(lambda d, a, b: d + weight * (a - b), delta, w, local)
        prev.update(finished)
        w = tree_map(lambda a, d: a - c["server_lr"] * d, w, delta)
    return w


def jitted_grad(loss):
    """numpy float64 gradient of a jax.numpy reference loss in its first argument. Jitted once per
    module (hyperparameters are arguments): one compilation per batch size."""
    grad = jax.jit(jax.grad(loss))
    return lambda params, *args: f64(grad(tree_map(jnp.asarray, params), *args))


def assert_term_matters(expected, without_term):
    """The regularizer really changes the reference's result (so the comparison can fail)."""
    assert global_norm(tree_map(np.subtract, expected, without_term)) > 1e-3


def mlp_forward(params, x):
    """(penultimate h, logits) of relu(x W1 + b1) W2 + b2."""
    h = jax.nn.relu(x.reshape(len(x), -1) @ params["fc1"]["kernel"] + params["fc1"]["bias"])
    return h, h @ params["fc2"]["kernel"] + params["fc2"]["bias"]


def projection_forward(params, x):
    """MOON's ModelFedCon on the MLP backbone: z = l2(relu(l1(h))), logits = l3(z)."""
    h = jax.nn.relu(x.reshape(len(x), -1) @ params["fc1"]["kernel"] + params["fc1"]["bias"])
    a = jax.nn.relu(h @ params["l1"]["kernel"] + params["l1"]["bias"])
    z = a @ params["l2"]["kernel"] + params["l2"]["bias"]
    return z, z @ params["l3"]["kernel"] + params["l3"]["bias"]


def mean_ce(logits, labels):
    return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(len(labels)), labels])


def run_fljax(alg, model, params, x, y, parts, c):
    with jax.enable_x64(True):
        round_fn = make_round(alg, model, federate(x, y, parts, NUM_CLASSES),
                              clients_per_round=COHORT, batch_size=c["batch"],
                              local_steps=c["local_steps"], local_epochs=c["local_epochs"],
                              aggregation=c["aggregation"], client_chunk=c["chunk"])
        state = init_state(alg, f64(params), len(parts), seed=SEED)
        for _ in range(ROUNDS):
            state, metrics = round_fn(state)
        assert bool(metrics["params_finite"])
        return jax.tree.map(np.asarray, state.params)


def local_sgd(c):
    return algorithms.local_sgd(c["lr"], round_decay=c["lr_decay"], momentum=c["momentum"],
                                weight_decay=c["weight_decay"], clip_norm=c["clip"])


def assert_trees_close(got, expected, rtol=1e-12):
    assert jax.tree.structure(got) == jax.tree.structure(expected)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
        assert a.dtype == np.float64
        np.testing.assert_allclose(a, b, rtol=rtol, atol=1e-13)


# ---------------------------------------------------------------- FedSAM

def sam_reference_grad(rho, eps):
    """Two passes: e = rho g/(||g|| + eps) at y, then the gradient at y + e (numpy)."""
    def grad_of(local, xb, yb, **_):
        ones = np.ones(len(yb))
        _, g = mlp_loss_and_grad(local, xb, yb, ones)
        scale = rho / (global_norm(g) + eps)
        _, g_sam = mlp_loss_and_grad(tree_map(lambda a, b: a + scale * b, local, g), xb, yb, ones)
        return g_sam
    return grad_of


def test_fedsam_matches_float64_reference():
    """Clipping after the second gradient, weight decay outside the perturbation, momentum."""
    c = CASES["epochs_momentum_clip"]
    x, y, parts, model = tiny_problem()
    params = model.init(jax.random.PRNGKey(1))
    rho, eps = 0.3, 1e-7
    with jax.enable_x64(True):
        expected = reference_run(params, x, y, parts, c, sam_reference_grad(rho, eps))
        assert_term_matters(expected, reference_run(params, x, y, parts, c,
                                                    sam_reference_grad(0.0, eps)))
    got = run_fljax(fedsam(local_sgd(c), rho=rho, eps=eps,
                           server_optimizer=optax.sgd(c["server_lr"])),
                    model, params, x, y, parts, c)
    assert_trees_close(got, expected)


def test_sam_loss_gradient_is_the_gradient_at_the_perturbed_point():
    """grad of L(y + stop_gradient(e(y))) == grad L(y + e): checked against two explicit passes
    (numpy gradients), on a full batch and on a batch with padded examples."""
    x, y, _, model = tiny_problem(seed=5)
    rho, eps = 0.5, 1e-12
    xb, yb = x[:8], y[:8]

    def model_loss(p, xs, ys, m, rng):
        return cross_entropy(model.apply(p, xs, train=True, rng=rng), ys, m)

    value_and_grad = jax.jit(jax.value_and_grad(sam_loss(model_loss, rho, eps)))
    params = f64(model.init(jax.random.PRNGKey(7)))
    for mask in [np.ones(8), np.array([1, 1, 1, 0, 1, 0, 0, 1], np.float64)]:
        with jax.enable_x64(True):
            value, grads = value_and_grad(params, jnp.asarray(xb), jnp.asarray(yb),
                                          jnp.asarray(mask), None)
        loss0, g = mlp_loss_and_grad(params, xb, yb, mask)
        e = tree_map(lambda a: rho * a / (global_norm(g) + eps), g)
        _, expected = mlp_loss_and_grad(tree_map(np.add, params, e), xb, yb, mask)
        np.testing.assert_allclose(float(value), loss0, rtol=1e-13)  # reported: unperturbed loss
        assert_trees_close(f64(grads), expected, rtol=1e-12)
        assert global_norm(tree_map(np.subtract, expected, g)) > 1e-3  # the perturbation matters


# ---------------------------------------------------------------- FedNTD

def ntd_loss(local, xb, yb, keep, global_logits, beta, tau):
    """CE + beta tau^2 KL(softmax(g_keep/tau) || softmax(l_keep/tau)), 'batchmean'."""
    logits = mlp_forward(local, xb)[1]
    rows = jnp.arange(len(yb))[:, None]
    log_q = jax.nn.log_softmax(logits[rows, keep] / tau)
    q_glob = jax.nn.softmax(global_logits[rows, keep] / tau)
    kl = jnp.sum(q_glob * (jnp.log(q_glob) - log_q), axis=1)
    return mean_ce(logits, yb) + beta * tau ** 2 * jnp.sum(kl) / len(yb)


ntd_grad = jitted_grad(ntd_loss)
mlp_forward_jit = jax.jit(mlp_forward)


def ntd_reference_grad(beta, tau):
    def grad_of(local, xb, yb, w, **_):
        keep = np.array([[k for k in range(NUM_CLASSES) if k != label] for label in yb])
        global_logits = mlp_forward_jit(w, xb)[1]  # a constant: no gradient
        return ntd_grad(local, xb, yb, keep, global_logits, beta, tau)
    return grad_of


def test_fedntd_matches_float64_reference():
    c = CASES["steps"]
    x, y, parts, model = tiny_problem(seed=1)
    params = model.init(jax.random.PRNGKey(2))
    beta, tau = 2.0, 1.7
    with jax.enable_x64(True):
        expected = reference_run(params, x, y, parts, c, ntd_reference_grad(beta, tau))
        assert_term_matters(expected, reference_run(params, x, y, parts, c,
                                                    ntd_reference_grad(0.0, tau)))
    got = run_fljax(fedntd(local_sgd(c), model, beta=beta, tau=tau,
                           server_optimizer=optax.sgd(c["server_lr"])),
                    model, params, x, y, parts, c)
    assert_trees_close(got, expected)


# ---------------------------------------------------------------- FedDecorr

def decorr_loss(local, xb, yb, beta):
    """CE + beta mean_{i != j} K_ij^2 / N, K = z^T z of the standardized features (torch code)."""
    z, logits = mlp_forward(local, xb)
    n, d = z.shape
    reg = 0.0
    if n > 1:  # FedDecorrLoss returns 0 for a batch of one
        z = z - z.mean(axis=0, keepdims=True)
        z = z / jnp.sqrt(1e-8 + z.var(axis=0, ddof=1, keepdims=True))
        corr = z.T @ z
        reg = jnp.mean(corr[~np.eye(d, dtype=bool)] ** 2) / n
    return mean_ce(logits, yb) + beta * reg


decorr_grad = jitted_grad(decorr_loss)


def decorr_reference_grad(beta):
    return lambda local, xb, yb, **_: decorr_grad(local, xb, yb, beta)


def test_feddecorr_matches_float64_reference():
    """The 'steps' schedule has batches with ONE valid example (regularizer 0) and with 3 of 4."""
    c = CASES["steps"]
    x, y, parts, model = tiny_problem(seed=2)
    params = model.init(jax.random.PRNGKey(3))
    beta = 0.5
    with jax.enable_x64(True):
        expected = reference_run(params, x, y, parts, c, decorr_reference_grad(beta))
        assert_term_matters(expected, reference_run(params, x, y, parts, c,
                                                    decorr_reference_grad(0.0)))
    got = run_fljax(feddecorr(local_sgd(c), model, beta=beta,
                              server_optimizer=optax.sgd(c["server_lr"])),
                    model, params, x, y, parts, c)
    assert_trees_close(got, expected)


def test_cases_have_partial_batches_with_one_valid_example():
    """The schedules really pad: some batch has a single valid example (FedDecorr's N = 1 case)
    and some a partial one with several (client sizes 7, 3, 12, 5, 9, 4)."""
    valid = [int(m.sum()) for c in CASES.values() for t in range(ROUNDS)
             for _, steps in schedule(t, c["batch"], c["local_steps"], c["local_epochs"])
             for _, m in steps]
    assert 1 in valid and any(1 < v < max(valid) for v in valid)


# ---------------------------------------------------------------- MOON

def cosine(a, b):
    return jnp.sum(a * b, axis=1) / (jnp.linalg.norm(a, axis=1) * jnp.linalg.norm(b, axis=1))


def moon_loss(local, xb, yb, z_glob, z_prev, mu, tau):
    """CE + mu CE([cos(z, z_glob), cos(z, z_prev)] / tau, label 0)."""
    z, logits = projection_forward(local, xb)
    sims = jnp.stack([cosine(z, z_glob), cosine(z, z_prev)], axis=1) / tau
    return mean_ce(logits, yb) + mu * mean_ce(sims, jnp.zeros(len(yb), int))


moon_grad = jitted_grad(moon_loss)
moon_grad_without_previous = jitted_grad(lambda local, xb, yb: mean_ce(
    projection_forward(local, xb)[1], yb))
projection_forward_jit = jax.jit(projection_forward)


@functools.lru_cache(maxsize=None)
def own_random_init(prev_seed, cid):
    """The random initialization of client ``cid`` (randomness from fljax's model.init)."""
    model = tiny_problem(projection=True)[3]
    return f64(model.init(jax.random.fold_in(jax.random.PRNGKey(prev_seed), cid)))


def moon_reference_grad(mu, tau, prev_init, prev_seed, w0):
    def grad_of(local, xb, yb, w, t, cid, prev):
        if prev_init == "random" and t == 0:
            # The official pool of previous models is empty in round 0: no contrastive term.
            return moon_grad_without_previous(local, xb, yb)
        if cid in prev:
            previous = prev[cid]
        elif prev_init == "global":
            previous = w0
        else:
            previous = own_random_init(prev_seed, cid)
        z_glob = projection_forward_jit(w, xb)[0]
        z_prev = projection_forward_jit(previous, xb)[0]
        return moon_grad(local, xb, yb, z_glob, z_prev, mu, tau)
    return grad_of


def test_moon_schedule_exercises_the_client_state():
    """Some client trains twice (its previous model is its own), and some first trains after
    round 0 (its previous model is the initial one)."""
    rounds = [[cid for cid, _ in schedule(t, 4, 3, None)] for t in range(ROUNDS)]
    seen = set(rounds[0])
    assert any(cid in seen for cid in rounds[1] + rounds[2])
    assert any(cid not in seen for cid in rounds[1] + rounds[2])


@pytest.mark.parametrize("prev_init,chunk", [("random", 1), ("global", 3)])
def test_moon_matches_float64_reference(prev_init, chunk):
    """The previous model of each client is tracked across rounds with partial participation;
    clients run one by one (chunk 1) or side by side (chunk 3, vmap)."""
    c = dict(CASES["steps"], chunk=chunk)
    x, y, parts, model = tiny_problem(seed=3, projection=True)
    params = model.init(jax.random.PRNGKey(4))
    mu, tau, prev_seed = 1.5, 0.5, 11
    with jax.enable_x64(True):
        expected = reference_run(params, x, y, parts, c, moon_reference_grad(
            mu, tau, prev_init, prev_seed, f64(params)))
        assert_term_matters(expected, reference_run(params, x, y, parts, c, moon_reference_grad(
            0.0, tau, prev_init, prev_seed, f64(params))))
    got = run_fljax(moon(local_sgd(c), model, mu=mu, tau=tau, prev_init=prev_init,
                         prev_seed=prev_seed, server_optimizer=optax.sgd(c["server_lr"])),
                    model, params, x, y, parts, c)
    assert_trees_close(got, expected)


# ---------------------------------------------------------------- projection head

def test_projection_head_parameter_count_matches_moon_simple_cnn():
    """MOON's ModelFedCon('simple-cnn', out_dim=256, 10 classes): backbone conv(3,6,5)-conv(6,16,5)-
    fc(400,120)-fc(120,84) = 61,156, l1 84x84 = 7,140, l2 84x256 = 21,760, l3 256x10 = 2,570."""
    base = from_module("simple-cnn", ConvNet(channels=(6, 16), hidden=(120, 84), num_classes=10),
                       (32, 32, 3), 10)
    model = with_projection_head(base, out_dim=256)
    params = jax.eval_shape(model.init, jax.random.PRNGKey(0))
    assert num_params(params) == 61_156 + 7_140 + 21_760 + 2_570 == 92_626
    assert model.groups == ("conv1", "conv2", "fc1", "fc2", "l1", "l2", "l3")
    z, logits = jax.eval_shape(model.apply_with_features, params, jnp.ones((3, 32, 32, 3)))
    assert z.shape == (3, 256) and logits.shape == (3, 10)


def test_projection_head_on_the_tiny_mlp():
    """fc1 4x5 + l1 5x5 + l2 5x4 + l3 4x3 (+ biases); logits = l3(l2(relu(l1(h)))); torch init."""
    x, _, _, model = tiny_problem(projection=True)
    params = model.init(jax.random.PRNGKey(0))
    assert num_params(params) == 25 + 30 + 24 + 15
    assert "fc2" not in params and model.groups == ("fc1", "l1", "l2", "l3")
    z, logits = model.apply_with_features(params, jnp.asarray(x[:6], jnp.float32))
    z_ref, logits_ref = projection_forward(params, jnp.asarray(x[:6], jnp.float32))
    np.testing.assert_allclose(z, z_ref, rtol=1e-6)
    np.testing.assert_allclose(logits, logits_ref, rtol=1e-6)
    np.testing.assert_array_equal(model.apply(params, x[:6]), logits)
    # torch's default Linear init: U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in 5, 5, 4.
    for name, fan_in in [("l1", 5), ("l2", 5), ("l3", 4)]:
        for leaf in params[name].values():
            assert np.abs(leaf).max() <= 1 / np.sqrt(fan_in)


def test_projection_head_rejects_bad_input():
    x, _, _, model = tiny_problem()
    with pytest.raises(FljaxError, match="out_dim"):
        with_projection_head(model, out_dim=0)
    misordered = model._replace(groups=("fc2", "fc1"))  # last group is not the classifier
    with pytest.raises(FljaxError, match="classifier"):
        with_projection_head(misordered)


# ---------------------------------------------------------------- reductions to FedAvg

REDUCTIONS = {  # on MOON's projection model, so one FedAvg run serves all
    "fedsam": lambda loc, m, srv: fedsam(loc, rho=0.0, server_optimizer=srv),
    "moon": lambda loc, m, srv: moon(loc, m, mu=0.0, prev_init="random", server_optimizer=srv),
    "fedntd": lambda loc, m, srv: fedntd(loc, m, beta=0.0, tau=2.0, server_optimizer=srv),
    "feddecorr": lambda loc, m, srv: feddecorr(loc, m, beta=0.0, server_optimizer=srv),
}
REDUCTION_CASE = dict(CASES["epochs_momentum_clip"], chunk=1)


@functools.lru_cache(maxsize=None)
def reduction_problem():
    x, y, parts, model = tiny_problem(seed=6, projection=True)
    params = model.init(jax.random.PRNGKey(8))
    c = REDUCTION_CASE
    fedavg = run_fljax(algorithms.fedavg(local_sgd(c), optax.sgd(c["server_lr"])), model, params,
                       x, y, parts, c)
    return x, y, parts, model, params, fedavg


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_zero_weight_is_fedavg_exactly(name):
    """rho = 0, mu = 0, beta = 0: bit-for-bit FedAvg (float64, 3 rounds, momentum, clip, partial
    batches). That a positive weight changes the result is checked by each reference test."""
    x, y, parts, model, params, fedavg = reduction_problem()
    c = REDUCTION_CASE
    zero = REDUCTIONS[name](local_sgd(c), model, optax.sgd(c["server_lr"]))
    assert zero.name == name
    got = run_fljax(zero, model, params, x, y, parts, c)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(fedavg)):
        np.testing.assert_array_equal(a, b)


# ---------------------------------------------------------------- bad hyperparameters

_, _, _, _MODEL = tiny_problem()
_LOCAL = algorithms.local_sgd(0.1)
BAD = [
    (lambda: fedsam(_LOCAL, rho=-0.1), "rho must be"),
    (lambda: fedsam(_LOCAL, rho=float("nan")), "rho must be"),
    (lambda: fedsam(_LOCAL, eps=0.0), "eps must be"),
    (lambda: moon(_LOCAL, _MODEL, mu=-1.0), "mu must be"),
    (lambda: moon(_LOCAL, _MODEL, tau=0.0), "tau must be"),
    (lambda: moon(_LOCAL, _MODEL, tau=-0.5), "tau must be"),
    (lambda: moon(_LOCAL, _MODEL, prev_init="zeros"), "prev_init must be"),
    (lambda: moon(_LOCAL, _MODEL, prev_seed=1.5), "prev_seed must be"),
    (lambda: moon(_LOCAL, _MODEL, mu="5"), "mu must be"),
    (lambda: fedntd(_LOCAL, _MODEL, beta=-1.0), "beta must be"),
    (lambda: fedntd(_LOCAL, _MODEL, tau=0.0), "tau must be"),
    (lambda: fedntd(_LOCAL, _MODEL, tau=float("inf")), "tau must be"),
    (lambda: feddecorr(_LOCAL, _MODEL, beta=-0.1), "beta must be"),
]


@pytest.mark.parametrize("build,message", BAD, ids=[m + str(i) for i, (_, m) in enumerate(BAD)])
def test_bad_hyperparameters_are_rejected(build, message):
    with pytest.raises(FljaxError, match=message):
        build()


def test_names():
    assert fedsam(_LOCAL).name == "fedsam"
    assert moon(_LOCAL, _MODEL).name == "moon"
    assert fedntd(_LOCAL, _MODEL).name == "fedntd"
    assert feddecorr(_LOCAL, _MODEL).name == "feddecorr"
