"""Models with state: BatchNorm running statistics carried through local steps, aggregated (FedAvg)
or kept local (FedBN), against a float64 plain-JAX reference written from torch's BatchNorm."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fljax import algorithms
from fljax.data.federated import federate
from fljax.core.engine import init_state, make_round
from fljax.errors import FljaxError
from fljax.models import from_module, make_model
from fljax.models.layers import BatchNorm, dense
from tests.reference import client_schedule, global_norm, tree_map

SIZES = [7, 3, 12, 5]
NUM_CLASSES = 3
EPS, MOMENTUM = 1e-5, 0.1


class BNNet(nn.Module):
    """fc1 -> BatchNorm -> ReLU -> fc2."""

    @nn.compact
    def __call__(self, x, train: bool = False, mask=None):
        x = x.reshape(x.shape[0], -1)
        h = nn.relu(BatchNorm(name="bn1")(dense(4, x.shape[-1], "fc1")(x), train, mask))
        return dense(NUM_CLASSES, 4, "fc2")(h)


def problem(seed=0):
    rng = np.random.default_rng(seed)
    n = sum(SIZES)
    x = rng.normal(size=(n, 3)) * np.array([1.0, 3.0, 0.5]) + 1.0
    y = rng.integers(0, NUM_CLASSES, n)
    parts = np.split(rng.permutation(n), np.cumsum(SIZES)[:-1])
    return x, y, parts, from_module("bnnet", BNNet(), (3,), NUM_CLASSES)


def reference_forward(w, x, mask):
    """torch's train-mode forward: (logits, batch mean, unbiased batch variance)."""
    z = x @ w["fc1"]["kernel"] + w["fc1"]["bias"]
    n = mask.sum()
    mu = (mask[:, None] * z).sum(0) / n
    var = (mask[:, None] * (z - mu) ** 2).sum(0) / n
    a = (z - mu) / jnp.sqrt(var + EPS) * w["bn1"]["scale"] + w["bn1"]["bias"]
    return jax.nn.relu(a) @ w["fc2"]["kernel"] + w["fc2"]["bias"], mu, var * n / (n - 1)


def reference_loss(trainable, stats, x, y, mask):
    w = {**trainable, "bn1": {**trainable["bn1"], **stats}}
    logits, _, _ = reference_forward(w, x, mask)
    logp = jax.nn.log_softmax(logits)
    return -(mask * logp[jnp.arange(len(y)), y]).sum() / mask.sum()


def split_stats(w):
    trainable = {**w, "bn1": {k: w["bn1"][k] for k in ("scale", "bias")}}
    return trainable, {k: w["bn1"][k] for k in ("mean", "var")}


def reference_rounds(w0, x, y, parts, *, rounds, cohort, batch, local_steps, lr, momentum,
                     weight_decay, clip, mu, local_bn):
    """FedProx (mu = 0: FedAvg) with torch SGD (clip, weight decay, momentum) on the trainable
    leaves; each step sets the running statistics from its batch at y_k (momentum 0.1, unbiased
    variance); the server averages every leaf (statistics too) weighted by examples. With
    ``local_bn`` (FedBN) a client trains from its own bn1 leaves and keeps them."""
    w = tree_map(lambda a: jnp.asarray(a, jnp.float64), w0)
    own = {cid: w["bn1"] for cid in range(len(parts))}
    counts = np.array([len(p) for p in parts])
    grad = jax.grad(reference_loss)
    for t in range(rounds):
        schedule = list(client_schedule(jax.random.PRNGKey(7), t, cohort, counts, batch,
                                        local_steps, None, counts.max()))
        ids = [cid for cid, _ in schedule]
        p = counts[ids] / counts[ids].sum()
        new = tree_map(lambda a: a, w)
        for weight, (cid, steps) in zip(p, schedule):
            start = {**w, "bn1": own[cid]} if local_bn else w       # the client's model w_i^t
            trainable, stats = split_stats(start)
            anchor = trainable
            buf = None
            for positions, mask in steps:
                examples = parts[cid][np.minimum(positions, counts[cid] - 1)]
                xb, yb, mb = jnp.asarray(x[examples]), jnp.asarray(y[examples]), jnp.asarray(mask)
                g = grad(trainable, stats, xb, yb, mb)
                g = tree_map(lambda gi, yi, ai: gi + mu * (yi - ai), g, trainable, anchor)
                g = tree_map(lambda a: a * clip / max(global_norm(g), clip), g)
                g = tree_map(lambda gi, yi: gi + weight_decay * yi, g, trainable)
                buf = g if buf is None else tree_map(lambda b, gi: momentum * b + gi, buf, g)
                _, mean, var = reference_forward({**trainable, "bn1": {**trainable["bn1"],
                                                                       **stats}}, xb, mb)
                stats = {"mean": (1 - MOMENTUM) * stats["mean"] + MOMENTUM * mean,
                         "var": (1 - MOMENTUM) * stats["var"] + MOMENTUM * var}
                trainable = tree_map(lambda yi, b: yi - lr * b, trainable, buf)
            end = {**trainable, "bn1": {**trainable["bn1"], **stats}}
            if local_bn:
                own[cid] = end["bn1"]
                end = {**end, "bn1": start["bn1"]}          # the server sees no change there
            new = tree_map(lambda n_, e, s: n_ + weight * (e - s), new, end, start)
        w = new
    return w, own


def test_batch_norm_layer_is_torchs():
    """Train mode normalises by the masked batch's biased variance and moves the running
    statistics by 0.1 towards its mean and UNBIASED variance; eval mode uses the statistics."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(5, 2, 3)) * 2.0 + 0.5
    mask = np.array([1, 1, 0, 1, 0], np.float64)
    with jax.enable_x64(True):
        layer = BatchNorm()
        variables = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64),
                                 layer.init(jax.random.key(0), jnp.asarray(x)))
        variables["params"] = {"scale": jnp.array([1.5, 0.5, 2.0]),
                               "bias": jnp.array([0.1, -0.2, 0.3])}
        out, state = layer.apply(variables, jnp.asarray(x), True, jnp.asarray(mask),
                                 mutable=["batch_stats"])
        evaluated = layer.apply({**variables, **state}, jnp.asarray(x))
        out, state, evaluated = jax.tree.map(np.asarray, (out, state, evaluated))
    real = x[mask == 1].reshape(-1, 3)                      # n = 3 examples x 2 positions
    mu, var = real.mean(0), real.var(0)
    np.testing.assert_allclose(out[mask == 1], ((x - mu) / np.sqrt(var + EPS) * [1.5, 0.5, 2.0]
                                                + [0.1, -0.2, 0.3])[mask == 1], rtol=1e-12)
    stats = state["batch_stats"]
    np.testing.assert_allclose(stats["mean"], 0.1 * mu, rtol=1e-12)
    np.testing.assert_allclose(stats["var"], 0.9 + 0.1 * real.var(0, ddof=1), rtol=1e-12)
    np.testing.assert_allclose(evaluated, (x - stats["mean"]) / np.sqrt(stats["var"] + EPS)
                               * [1.5, 0.5, 2.0] + [0.1, -0.2, 0.3], rtol=1e-12)


def test_state_lives_next_to_its_layers_parameters():
    model = make_model("convnet2", (28, 28, 1), 62)
    params = model.init(jax.random.key(0))
    assert model.groups == ("conv1", "bn1", "conv2", "bn2", "fc1", "fc2")
    assert sorted(params["bn2"]) == ["bias", "mean", "scale", "var"]
    assert model.state_mask["bn1"] == {"bias": False, "mean": True, "scale": False, "var": True}
    assert model.state_mask["fc1"] == {"bias": False, "kernel": False}
    assert make_model("mlp", (4,), 3).state_mask is None


@pytest.mark.parametrize("local_bn", [False, True], ids=["fedprox", "fedprox+fedbn"])
def test_rounds_with_batch_norm_match_float64_reference(local_bn):
    x, y, parts, model = problem()
    settings = dict(rounds=2, cohort=3, batch=5, local_steps=4, lr=0.2, momentum=0.9,
                    weight_decay=1e-2, clip=1.0, mu=0.5)
    with jax.enable_x64(True):
        params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64),
                              model.init(jax.random.PRNGKey(1)))
        expected, own = reference_rounds(params, x, y, parts, local_bn=local_bn, **settings)
        algorithm = algorithms.fedprox(algorithms.local_sgd(
            settings["lr"], momentum=settings["momentum"], weight_decay=settings["weight_decay"],
            clip_norm=settings["clip"]), mu=settings["mu"])
        if local_bn:
            algorithm = algorithms.fedbn(algorithm, params)
        round_fn = make_round(algorithm, model, federate(x, y, parts, NUM_CLASSES),
                              clients_per_round=3, batch_size=5, local_steps=4)
        state = init_state(algorithm, params, len(parts), seed=7)
        for _ in range(2):
            state, _ = round_fn(state)
        got = jax.tree.map(np.asarray, state.params)
        clients_bn = jax.tree.map(np.asarray, state.client_states[1]["bn1"]) if local_bn else None
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    moved = not np.allclose(got["bn1"]["mean"], params["bn1"]["mean"])
    assert moved != local_bn         # FedAvg averages the statistics; FedBN's server keeps w^0's
    if local_bn:
        for cid, leaves in own.items():
            for name, value in leaves.items():
                np.testing.assert_allclose(clients_bn[name][cid], value, rtol=1e-10, atol=1e-12)
        trained = [cid for cid in own if not np.allclose(own[cid]["mean"], 0.0)]
        assert len(trained) >= 2 and not np.allclose(own[trained[0]]["mean"],
                                                      own[trained[1]]["mean"])
        for cid in own:   # FedBN's personal model: the global one with the client's own BN
            mine = algorithm.personal_model(state.params, state.server_state, jax.tree.map(
                lambda a: a[cid], state.client_states))
            for name, value in own[cid].items():
                np.testing.assert_allclose(mine["bn1"][name], value, rtol=1e-10, atol=1e-12)
            for a, b in zip(jax.tree.leaves({k: v for k, v in mine.items() if k != "bn1"}),
                            jax.tree.leaves({k: v for k, v in got.items() if k != "bn1"})):
                np.testing.assert_array_equal(a, b)


def test_convnet2_trains_and_evaluates_with_running_statistics():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 4, 96)
    x = (rng.normal(size=(96, 8, 8, 1)) + y[:, None, None, None]).astype(np.float32)
    parts = np.split(np.arange(96), 4)
    model = make_model("convnet2", (8, 8, 1), 4)
    algorithm = algorithms.fedavg(algorithms.local_sgd(0.05))
    round_fn = make_round(algorithm, model, federate(x, y, parts, 4), clients_per_round=2,
                          batch_size=8, local_steps=5)
    state = round_fn.init_state(model.init(jax.random.key(0)), seed=0)
    losses = []
    for _ in range(6):
        state, metrics = round_fn(state)
        losses.append(float(metrics["train_loss"]))
    assert losses[-1] < losses[0]
    eval_logits = model.apply(state.params, jnp.asarray(x[:8]))
    train_logits = model.apply(state.params, jnp.asarray(x[:8]), train=True,
                               rng=jax.random.key(0))
    assert not np.allclose(eval_logits, train_logits)     # eval uses the running statistics


def test_fedbn_keeps_normalization_layers_by_federatedscopes_name_rule():
    fedavg = algorithms.fedavg(algorithms.local_sgd(0.1))
    with pytest.raises(FljaxError, match="needs normalization layers"):
        algorithms.fedbn(fedavg, make_model("mlp", (4,), 3).init(jax.random.key(0)))
    bert = make_model("bert_tiny", np.zeros(8, np.int32), 2)
    local = algorithms.fedbn(fedavg, jax.eval_shape(bert.init, jax.random.key(0))).client_init(
        jax.eval_shape(bert.init, jax.random.key(0)))[1]
    kept = {tuple(k.key for k in path[:-1])
            for path, _ in jax.tree_util.tree_flatten_with_path(local)[0]}
    assert kept == {("embedding_norm",), ("layer0", "attention_norm"), ("layer0", "ffn_norm"),
                    ("layer1", "attention_norm"), ("layer1", "ffn_norm")}
