"""Token models: the character LSTM's cell equations, the BERT-shaped transformer against a float64
reference of BERT's equations, padding, local pretrained checkpoints and their bad input, and the
transformer training in the compiled round."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.traverse_util import flatten_dict

from fljax import algorithms
from fljax.data.federated import federate
from fljax.core.engine import make_round
from fljax.errors import FljaxError
from fljax.models.evaluate import make_evaluator
from fljax.models import from_module
from fljax.models.text import (CharLSTM, TransformerClassifier, huggingface_names,
                               load_bert_checkpoint)
from scipy.special import erf

TINY = dict(num_classes=3, vocab=11, hidden=8, layers=1, heads=2, intermediate=12,
            max_positions=6, dropout=0.1)


def tiny_bert():
    return from_module("bert", TransformerClassifier(**TINY), jnp.zeros((6,), jnp.int32))


def layer_norm(x, p):
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-12) * p["scale"] + p["bias"]


def dense(x, p):
    return x @ p["kernel"] + p["bias"]


def bert_reference(p, tokens):
    """BERT's encoder (post-LN, exact GELU, pad positions masked) and classifier in float64."""
    t = tokens.shape[1]
    h = p["word_embeddings"]["embedding"][tokens] + p["position_embeddings"]["embedding"][:t] \
        + p["token_type_embeddings"]["embedding"][0]
    h = layer_norm(h, p["embedding_norm"])
    layer = p["layer0"]
    b, d, heads = len(tokens), TINY["hidden"], TINY["heads"]
    split = lambda a: a.reshape(b, t, heads, d // heads).transpose(0, 2, 1, 3)
    q, k, v = (split(dense(h, layer[n])) for n in ("query", "key", "value"))
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d // heads)
    scores = np.where((tokens != 0)[:, None, None, :], scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    context = (weights @ v).transpose(0, 2, 1, 3).reshape(b, t, d)
    h = layer_norm(h + dense(context, layer["output"]), layer["attention_norm"])
    inner = dense(h, layer["ffn_in"])
    h = layer_norm(h + dense(0.5 * inner * (1 + erf(inner / np.sqrt(2))), layer["ffn_out"]),
                   layer["ffn_norm"])
    return dense(np.tanh(dense(h[:, 0], p["pooler"])), p["classifier"])


def test_transformer_matches_float64_bert_equations_and_ignores_padding():
    model = tiny_bert()
    tokens = np.array([[2, 5, 7, 0, 0, 0], [2, 9, 3, 4, 10, 1]])
    with jax.enable_x64(True):
        params = jax.tree.map(lambda a: np.asarray(a, np.float64),
                              model.init(jax.random.key(0)))
        got = np.asarray(model.apply(params, jnp.asarray(tokens)))
        padded_differently = np.asarray(model.apply(params, jnp.asarray(
            [[2, 5, 7, 0, 0, 0], [2, 5, 7, 0, 0, 0]])))
    np.testing.assert_allclose(got, bert_reference(params, tokens), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(padded_differently[0], padded_differently[1], rtol=1e-12)



def test_training_mode_without_an_rng_runs_without_dropout():
    """A training-mode call without a dropout key (a client's full gradient, FedEM's E-step) is
    the evaluation-mode network; with a key, dropout is on."""
    model = tiny_bert()
    tokens = jnp.asarray([[2, 5, 7, 0, 0, 0], [2, 9, 3, 4, 10, 1]])
    params = model.init(jax.random.key(0))
    plain = model.apply(params, tokens)
    np.testing.assert_array_equal(model.apply(params, tokens, train=True), plain)
    dropped = model.apply(params, tokens, train=True, rng=jax.random.key(1))
    assert np.abs(np.asarray(dropped) - np.asarray(plain)).max() > 1e-4

def test_char_lstm_cell_is_the_lstm_equations():
    """One layer (float32 against a float64 reference): i, f, o = sigmoid, g = tanh of W_i x + W_h h (+ b on the h side);
    c' = f c + i g, h' = o tanh(c')."""
    model = from_module("lstm", CharLSTM(vocab=7, hidden=3, layers=1, embed=2),
                        jnp.zeros((4,), jnp.int32))
    tokens = np.array([[1, 4, 6, 0]])
    params = model.init(jax.random.key(1))
    got, _ = model.apply_with_features(params, jnp.asarray(tokens))
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    cell = p["lstm1"]
    h = c = np.zeros(3)
    sigmoid = lambda z: 1 / (1 + np.exp(-z))
    for token in tokens[0]:
        x = p["embed"]["embedding"][token]
        gate = lambda g: x @ cell[f"i{g}"]["kernel"] + h @ cell[f"h{g}"]["kernel"] + \
            cell[f"h{g}"]["bias"]
        c = sigmoid(gate("f")) * c + sigmoid(gate("i")) * np.tanh(gate("g"))
        h = sigmoid(gate("o")) * np.tanh(c)
    np.testing.assert_allclose(np.asarray(got)[0, -1], h, rtol=1e-5, atol=1e-6)


def to_huggingface(params, layers=1) -> dict:
    flat = flatten_dict(params)
    return {theirs: np.asarray(flat[ours]).T if ours[-1] == "kernel" else np.asarray(flat[ours])
            for ours, theirs in huggingface_names(layers).items()}


def test_pretrained_checkpoint_round_trip(tmp_path):
    model = tiny_bert()
    source = model.init(jax.random.key(1))
    np.savez(tmp_path / "bert.npz", **to_huggingface(source))
    fresh = model.init(jax.random.key(2))
    loaded = load_bert_checkpoint(str(tmp_path / "bert.npz"), fresh, layers=1)
    tokens = jnp.array([[2, 3, 4, 0, 0, 0]])
    features = lambda p: model.apply_with_features(p, tokens)[0]
    np.testing.assert_allclose(features(loaded), features(source), rtol=1e-6)
    np.testing.assert_array_equal(loaded["classifier"]["kernel"], fresh["classifier"]["kernel"])


@pytest.mark.parametrize("case", ["missing", "not_npz", "key", "shape"])
def test_bad_pretrained_checkpoint_is_one_line(tmp_path, case):
    model = tiny_bert()
    params = model.init(jax.random.key(0))
    weights = to_huggingface(params)
    path = tmp_path / "bert.npz"
    if case == "not_npz":
        path.write_text("not a zip")
    elif case == "key":
        del weights["bert.pooler.dense.bias"]
    elif case == "shape":
        weights["bert.embeddings.word_embeddings.weight"] = np.zeros((12, 8))
    if case in ("key", "shape"):
        np.savez(path, **weights)
    with pytest.raises(FljaxError) as err:
        load_bert_checkpoint(str(path), params, layers=1)
    expected = {"missing": "does not exist", "not_npz": "not a readable .npz",
                "key": "lacks 'bert.pooler.dense.bias'",
                "shape": "has shape (12, 8); the model needs (11, 8)"}[case]
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_transformer_trains_on_tokens_in_the_compiled_round():
    rng = np.random.default_rng(0)
    n = 48
    y = rng.integers(0, 3, n)
    x = np.zeros((n, 6), np.int32)
    x[:, 0] = 1                                        # [CLS]
    x[:, 1] = 2 + 3 * y + rng.integers(0, 3, n)        # a class-revealing token
    x[:, 2:4] = rng.integers(2, 11, (n, 2))
    model = tiny_bert()
    data = federate(x, y, np.split(np.arange(n), 4), 3)
    # Every client takes part, at a learning rate of 0.1. The test had cohorts of 2 of the 4
    # clients at 0.3 and passed by luck of the draws: 8 local steps (4 epochs of a client's 12
    # examples) pull the model to the last cohort's data, and some pairs lack a class-revealing
    # token (clients 0 and 3 have no token 5) or a class (client 3 has one example of class 2),
    # so the accuracy after the last round swung between 0.6 and 1.0 with the cohort drawn. When
    # the cohort sampler became Floyd's (36cdd3a), seed 0's last cohort became (0, 3): 0.625.
    # Full cohorts at 0.3 still swung (0.52 after round 11 for seed 5); at 0.1 seeds 0-5 are all
    # at >= 0.979 from round 8 on.
    round_fn = make_round(algorithms.fedavg(algorithms.local_sgd(0.1)), model, data,
                          clients_per_round=4, batch_size=6, local_steps=8)
    state = round_fn.init_state(model.init(jax.random.key(0)), seed=0)
    evaluate = make_evaluator(model, x, y)
    for _ in range(10):
        state, _ = round_fn(state)
    assert float(evaluate(state.params)["accuracy"]) > 0.8
