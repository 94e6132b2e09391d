"""Inputs beyond float images: integer tokens, one label per position (-1: not scored), and dicts of
arrays (a graph), through batching, local training, the loss and the evaluator."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fljax import algorithms
from fljax.data.federated import federate
from fljax.core.engine import init_state, make_round
from fljax.errors import FljaxError
from fljax.models.evaluate import make_evaluator
from fljax.models import cross_entropy, from_module
from tests.reference import client_schedule, tree_map

VOCAB, LENGTH, SIZES = 5, 4, [6, 3, 8]


class TokenTagger(nn.Module):
    """Embedding -> dense per position: logits [B, T, VOCAB]."""

    @nn.compact
    def __call__(self, x, train: bool = False):
        return nn.Dense(VOCAB, name="out")(nn.Embed(VOCAB, 3, name="embed")(x))


class TwoInputs(nn.Module):
    """A dict input: logits from the sum of two feature arrays."""

    @nn.compact
    def __call__(self, x, train: bool = False):
        return nn.Dense(3, name="out")(x["a"] + 2.0 * x["b"])


def token_problem(seed=0):
    rng = np.random.default_rng(seed)
    n = sum(SIZES)
    x = rng.integers(0, VOCAB, (n, LENGTH)).astype(np.int32)
    y = np.roll(x, -1, axis=1)                      # next token ...
    y[rng.random((n, LENGTH)) < 0.3] = -1           # ... some positions unscored
    parts = np.split(rng.permutation(n), np.cumsum(SIZES)[:-1])
    return x, y, parts


def reference_loss(params, x, y, mask):
    """Mean cross-entropy over positions with y >= 0 of the examples with mask 1."""
    logits = params["embed"]["embedding"][x] @ params["out"]["kernel"] + params["out"]["bias"]
    logp = jax.nn.log_softmax(logits)
    scored = (y >= 0) * mask[:, None]
    picked = jnp.take_along_axis(logp, jnp.maximum(y, 0)[..., None], -1)[..., 0]
    return -(picked * scored).sum() / scored.sum()


def test_cross_entropy_scores_only_labels_of_real_examples():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(3, 4, 5))
    labels = np.array([[0, 1, -1, 4], [2, -1, -1, 3], [1, 1, 1, 1]])
    mask = np.array([1.0, 1.0, 0.0])
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    picked = [(-logp[b, t, labels[b, t]]) for b in range(2) for t in range(4) if labels[b, t] >= 0]
    np.testing.assert_allclose(cross_entropy(jnp.asarray(logits), jnp.asarray(labels),
                                             jnp.asarray(mask)), np.mean(picked), rtol=1e-6)


def test_token_rounds_match_float64_reference():
    x, y, parts = token_problem()
    model = from_module("tagger", TokenTagger(), jnp.zeros((LENGTH,), jnp.int32))
    assert model.num_classes == VOCAB and model.input_spec.dtype == jnp.int32
    lr, batch, steps = 0.5, 4, 3
    with jax.enable_x64(True):
        params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64),
                              model.init(jax.random.PRNGKey(0)))
        algorithm = algorithms.fedavg(algorithms.local_sgd(lr))
        data = federate(x, y, parts, VOCAB)
        assert data.x.dtype == jnp.int32
        round_fn = make_round(algorithm, model, data, clients_per_round=2, batch_size=batch,
                              local_steps=steps)
        state = init_state(algorithm, params, len(parts), seed=4)
        w = params
        counts = np.array(SIZES)
        grad = jax.grad(reference_loss)
        for t in range(2):
            state, _ = round_fn(state)
            schedule = list(client_schedule(jax.random.PRNGKey(4), t, 2, counts, batch, steps,
                                            None, counts.max()))
            ids = [cid for cid, _ in schedule]
            p = counts[ids] / counts[ids].sum()
            new = w
            for weight, (cid, batches) in zip(p, schedule):
                local = w
                for positions, mask in batches:
                    ex = parts[cid][np.minimum(positions, counts[cid] - 1)]
                    g = grad(local, jnp.asarray(x[ex]), jnp.asarray(y[ex]), jnp.asarray(mask))
                    local = tree_map(lambda a, b: a - lr * b, local, g)
                new = tree_map(lambda n_, a, b: n_ + weight * (b - a), new, w, local)
            w = new
        for got, want in zip(jax.tree.leaves(state.params), jax.tree.leaves(w)):
            np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-12)


def test_evaluator_counts_scored_positions():
    x, y, _ = token_problem(2)
    model = from_module("tagger", TokenTagger(), jnp.zeros((LENGTH,), jnp.int32))
    params = model.init(jax.random.key(3))
    scores = make_evaluator(model, x, y, batch_size=4)(params)
    predictions = np.asarray(model.apply(params, jnp.asarray(x))).argmax(-1)
    scored = y >= 0
    assert float(scores["accuracy"]) == pytest.approx((predictions == y)[scored].mean(), rel=1e-6)


def test_dict_inputs_train_and_evaluate():
    rng = np.random.default_rng(0)
    n = 30
    y = rng.integers(0, 3, n)
    x = {"a": np.eye(3, dtype=np.float32)[y] + 0.1 * rng.normal(size=(n, 3)).astype(np.float32),
         "b": rng.normal(size=(n, 3)).astype(np.float32) * 0.01}
    model = from_module("two", TwoInputs(), {"a": np.zeros(3, np.float32),
                                             "b": np.zeros(3, np.float32)})
    with pytest.raises(FljaxError, match="structured inputs"):
        model.input_shape
    parts = np.split(np.arange(n), 3)
    algorithm = algorithms.fedavg(algorithms.local_sgd(0.5))
    round_fn = make_round(algorithm, model, federate(x, y, parts, 3), clients_per_round=3,
                          batch_size=5, local_steps=4)
    state = round_fn.init_state(model.init(jax.random.key(0)), seed=0)
    evaluate = make_evaluator(model, x, y)
    before = float(evaluate(state.params)["loss"])
    for _ in range(5):
        state, _ = round_fn(state)
    assert float(evaluate(state.params)["loss"]) < 0.5 * before


def test_inputs_and_labels_are_checked():
    x, y, parts = token_problem()
    with pytest.raises(FljaxError, match=r"labels must lie in \[0, 5\) \(-1: not scored\)"):
        federate(x, np.where(y < 0, -2, y), parts, VOCAB)
    with pytest.raises(FljaxError, match="one N for every input array"):
        federate({"a": x, "b": x[:-1]}, y, parts, VOCAB)
