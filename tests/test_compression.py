"""Uplink compression (``fljax.compression``, ``fljax.algorithms.compress``, FedPAQ).

Each compressor equals a float64 numpy reference written from its module docstring's equation with
the same random draws (Hadamard matrix from scipy); the unbiased ones are unbiased (and the biased
ones are seen to be biased) over 20,000 keys in one program; every compressor is positively
homogeneous and error feedback keeps sent + p e' = m + p e exactly; the bit counts are the
docstrings' formulas, computed by hand here, per tensor, per client and in a run's log; ratio 1
reduces to the uncompressed algorithm (FedAvg, SCAFFOLD); FedAvg + top-k + error feedback and
FedAvg + QSGD + error feedback under Bernoulli participation equal a float64 numpy reference that
keeps every client's residual; dp composes around compress (not inside it); batched runs equal
runs alone; FedPAQ is compress(fedavg, 'qsgd'); top-k's share is structure, never traced; bad
input is a one-line error."""

import functools
import json
import math
import os
import re
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

import fljax
from fljax import FljaxError, algorithms
from fljax.runner import grouping
from fljax.accounting import client_bits
from fljax.algorithms.compress import encode_message
from fljax.runner.cli import main
from fljax.population.cohort import client_keys, message_keys, round_key
from fljax.compression import make, qsgd, random_k, rotated_uniform, scaled_sign, top_k
from fljax.compression.rotation import walsh_hadamard
from fljax.data.federated import federate
from fljax.core.engine import init_state, make_round
from fljax.runner.experiment import build_algorithm
from tests.reference import client_schedule, global_norm, local_sgd, tree_map
from tests.test_fedavg_reference import NUM_CLASSES, tiny_problem
from tests.test_runs import compare

LR, STEPS, BATCH, COHORT = 0.3, 3, 4, 3


# --- numpy references, from each module docstring's equation ------------------------------------

def uniform(key, shape):
    """The float64 uniforms the implementation draws from ``key`` (under x64)."""
    return np.asarray(jax.random.uniform(key, shape, jnp.float64))


def kept_ref(ratio, d):
    """k = ceil(ratio d), in exact decimal arithmetic (0.1 * 200 is 20)."""
    return max(1, min(d, math.ceil(Fraction(str(ratio)) * d)))


def top_k_ref(x, ratio):
    """x_j for the k largest |x_j|, 0 elsewhere."""
    idx = np.argsort(-np.abs(x), kind="stable")[:kept_ref(ratio, len(x))]
    out = np.zeros_like(x)
    out[idx] = x[idx]
    return out


def random_k_ref(x, ratio, unbiased, key):
    """x_j (times d / k if unbiased) on a uniform k-subset: the k largest of d uniform draws."""
    d = len(x)
    k = kept_ref(ratio, d)
    idx = np.argsort(-np.asarray(jax.random.uniform(key, (d,), jnp.float32)), kind="stable")[:k]
    out = np.zeros_like(x)
    out[idx] = x[idx] * (d / k if unbiased else 1.0)
    return out


def qsgd_ref(x, levels, bucket_size, key):
    """Q_s(v_j) = ||v|| sgn(v_j) xi_j / s per bucket v, xi_j = l + 1 w.p. s|v_j|/||v|| - l."""
    d = len(x)
    b = d if bucket_size is None else min(bucket_size, d)
    buckets = -(-d // b)
    padded = np.concatenate([x, np.zeros(buckets * b - d)]).reshape(buckets, b)
    draws = uniform(key, (buckets, b))
    out = np.zeros_like(padded)
    for i, v in enumerate(padded):
        norm = math.sqrt(np.sum(v ** 2))
        if norm == 0:
            continue
        r = levels * np.abs(v) / norm
        low = np.floor(r)
        xi = low + (draws[i] < r - low)
        out[i] = norm * np.sign(v) * xi / levels
    return out.reshape(-1)[:d]


def scaled_sign_ref(x):
    """(||x||_1 / d) sign(x), sign(0) = +1."""
    return np.sum(np.abs(x)) / len(x) * np.where(x >= 0, 1.0, -1.0)


def rotated_uniform_ref(x, bits, key, shared_key):
    """z = H D x / sqrt(d'), stochastic rounding to 2^b levels on [min z, max z], x^ = D H z^ /
    sqrt(d'), with H Sylvester's Hadamard matrix (scipy) and D the shared key's signs."""
    d = len(x)
    n = 1
    while n < d:
        n *= 2
    signs = np.asarray(jax.random.rademacher(shared_key, (n,), jnp.float64))
    hadamard = scipy.linalg.hadamard(n).astype(np.float64)
    z = hadamard @ (signs * np.concatenate([x, np.zeros(n - d)])) / math.sqrt(n)
    low, high = z.min(), z.max()
    if high == low:                       # one value (d' = 1, or x = 0): every level is it
        return (signs * (hadamard @ z) / math.sqrt(n))[:d]
    step = (high - low) / (2 ** bits - 1)
    r = (z - low) / step
    level = np.floor(r) + (uniform(key, (n,)) < r - np.floor(r))
    return (signs * (hadamard @ (low + level * step)) / math.sqrt(n))[:d]


# (compressor, its numpy reference (x, key, shared key) -> C(x))
CASES = {
    "top_k(0.3)": (top_k(0.3), lambda x, k, s: top_k_ref(x, 0.3)),
    "top_k(0.07)": (top_k(0.07), lambda x, k, s: top_k_ref(x, 0.07)),
    "random_k(0.25)": (random_k(0.25), lambda x, k, s: random_k_ref(x, 0.25, False, k)),
    "random_k(0.25,unbiased)": (random_k(0.25, unbiased=True),
                                lambda x, k, s: random_k_ref(x, 0.25, True, k)),
    "qsgd(1)": (qsgd(1), lambda x, k, s: qsgd_ref(x, 1, None, k)),
    "qsgd(4,bucket5)": (qsgd(4, bucket_size=5), lambda x, k, s: qsgd_ref(x, 4, 5, k)),
    "qsgd(2,bucket64)": (qsgd(2, bucket_size=64), lambda x, k, s: qsgd_ref(x, 2, 64, k)),
    "scaled_sign": (scaled_sign(), lambda x, k, s: scaled_sign_ref(x)),
    "rotated_uniform(1)": (rotated_uniform(1), lambda x, k, s: rotated_uniform_ref(x, 1, k, s)),
    "rotated_uniform(3)": (rotated_uniform(3), lambda x, k, s: rotated_uniform_ref(x, 3, k, s)),
}

EVERY = {name: codec for name, (codec, _) in CASES.items()}


def example_vector(d, seed=0):
    """Gaussian coordinates of mixed scales, one whole 5-bucket (10..14) zero when d >= 15."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=d) * rng.choice([0.1, 1.0, 3.0], size=d)
    if d >= 15:
        x[10:15] = 0.0
    return x


DIMS = (37, 16, 1)


@pytest.fixture(scope="module")
def encoded():
    """{d: (x, C(x) with client key 11, C(x) with client key 13)} for every compressor, shared key
    12: one program per d."""
    out = {}
    with jax.enable_x64(True):
        every = jax.jit(lambda x, key, shared: {name: codec.encode(x, key, shared)
                                                for name, (codec, _) in CASES.items()})
        for d in DIMS:
            x = example_vector(d)
            out[d] = (x, *jax.device_get([every(jnp.asarray(x), jax.random.PRNGKey(k),
                                                jax.random.PRNGKey(12)) for k in (11, 13)]))
    return out


@pytest.mark.parametrize("d", DIMS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_compressors_match_float64_references_with_the_same_draws(encoded, name, d):
    """d = 37 (not a power of two: rotation pads to 64; QSGD's 5-buckets leave 2 over, one
    bucket all zero), 16, and a single entry."""
    x, first, second = encoded[d]
    got = first[name]
    with jax.enable_x64(True):
        expected = CASES[name][1](x, jax.random.PRNGKey(11), jax.random.PRNGKey(12))
    assert got.dtype == np.float64 and got.shape == (d,)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    if d > 1 and name != "random_k(0.25,unbiased)":
        assert not np.allclose(got, x)                      # it really compressed
    if d > 1 and name.startswith(("random", "qsgd", "rotated")):
        assert not np.allclose(second[name], got)           # the client key is really used


def test_top_k_breaks_ties_by_the_lower_index_and_float32_stays_float32():
    x = jnp.asarray([1.0, -1.0, 1.0, -1.0, 0.5, 0.5], jnp.float32)
    np.testing.assert_array_equal(top_k(0.5).encode(x, None, None), [1, -1, 1, 0, 0, 0])
    every = jax.jit(lambda x, key, shared: {name: codec.encode(x, key, shared)
                                            for name, codec in EVERY.items()})
    for name, c in every(jnp.asarray(example_vector(37), jnp.float32), jax.random.PRNGKey(0),
                         jax.random.PRNGKey(1)).items():
        assert c.dtype == jnp.float32 and c.shape == (37,) and bool(jnp.all(jnp.isfinite(c))), name


def test_walsh_hadamard_is_sylvesters_matrix():
    x = np.random.default_rng(1).normal(size=32)
    with jax.enable_x64(True):
        np.testing.assert_allclose(np.asarray(walsh_hadamard(jnp.asarray(x))),
                                   scipy.linalg.hadamard(32) @ x, rtol=1e-12, atol=1e-12)


def test_message_keys_are_each_clients_own_and_the_shared_key_is_the_rounds():
    """Two clients of a round: their own keys differ, their shared key is the same; the next
    round's shared key differs; none is one of the client's start, batch or step keys."""
    key = jax.random.PRNGKey(3)
    raw = lambda k: tuple(np.asarray(jax.random.key_data(k)).ravel())
    _, client_key = round_key(key, 0)
    (own1, shared1), (own2, shared2) = (message_keys(client_key, c) for c in (1, 2))
    assert raw(own1) != raw(own2) and raw(shared1) == raw(shared2)
    assert raw(message_keys(round_key(key, 1)[1], 1)[1]) != raw(shared1)
    assert {raw(own1), raw(shared1)}.isdisjoint(raw(k) for k in client_keys(client_key, 1))


# --- unbiasedness -------------------------------------------------------------------------------

SAMPLED = {
    "random_k_unbiased": random_k(0.3, unbiased=True),
    "qsgd_1": qsgd(1),
    "qsgd_3_bucket4": qsgd(3, bucket_size=4),
    "rotated_uniform_2": rotated_uniform(2),
    "random_k_biased": random_k(0.3),
    "top_k": top_k(0.3),
    "scaled_sign": scaled_sign(),
}
DRAWS = 20_000


@pytest.fixture(scope="module")
def sampled():
    """C(x) over 20,000 (client key, shared key) pairs for every compressor above: one program."""
    with jax.enable_x64(True):
        x = jnp.asarray(example_vector(10, seed=3))
        keys = jax.random.split(jax.random.PRNGKey(0), DRAWS)
        shared = jax.random.split(jax.random.PRNGKey(1), DRAWS)
        draw = jax.jit(jax.vmap(lambda k, s: {name: codec.encode(x, k, s)
                                              for name, codec in SAMPLED.items()}))
        out = jax.device_get(draw(keys, shared))
    return np.asarray(x), out


@pytest.mark.parametrize("name", ["random_k_unbiased", "qsgd_1", "qsgd_3_bucket4",
                                  "rotated_uniform_2"])
def test_unbiased_compressors_average_to_x(sampled, name):
    x, out = sampled
    samples = out[name]
    assert SAMPLED[name].unbiased
    error = samples.mean(0) - x
    standard_error = samples.std(0) / math.sqrt(DRAWS)
    assert np.all(standard_error > 0)                         # every coordinate is random
    assert np.all(np.abs(error) <= 4.5 * standard_error), np.abs(error) / standard_error


def test_qsgd_variance_is_within_the_papers_bound(sampled):
    """E||Q_s(v) - v||^2 <= min(d/s^2, sqrt(d)/s) ||v||^2 (Lemma 3.1), per bucket, summed."""
    x, out = sampled
    for name, s, b in (("qsgd_1", 1, 10), ("qsgd_3_bucket4", 3, 4)):
        variance = np.mean(np.sum((out[name] - x) ** 2, axis=1))
        bound = sum(min(len(v) / s ** 2, math.sqrt(len(v)) / s) * np.sum(v ** 2)
                    for v in np.split(x, range(b, len(x), b)))
        assert 0 < variance <= bound


def test_biased_compressors_are_seen_to_be_biased(sampled):
    """The same check rejects random-k without the d/k scale (E = (k/d) x): the test can tell;
    top-k and scaled sign are deterministic and their mean is C(x), far from x."""
    x, out = sampled
    samples = out["random_k_biased"]
    assert not SAMPLED["random_k_biased"].unbiased
    np.testing.assert_allclose(samples.mean(0), 3 / 10 * x, atol=0.05 * np.abs(x).max())
    z = np.abs(samples.mean(0) - x) / (samples.std(0) / math.sqrt(DRAWS))
    assert z.max() > 20
    for name in ("top_k", "scaled_sign"):
        assert not SAMPLED[name].unbiased
        np.testing.assert_array_equal(np.ptp(out[name], axis=0), 0)
        assert np.abs(out[name].mean(0) - x).max() > 0.1 * np.abs(x).max()


# --- homogeneity and error feedback -------------------------------------------------------------

def test_every_compressor_is_positively_homogeneous():
    """C(p x) = p C(x) with the same randomness: what keeping the residual per unit of p needs."""
    with jax.enable_x64(True):
        x = jnp.asarray(example_vector(23, seed=4))
        key, shared = jax.random.PRNGKey(2), jax.random.PRNGKey(3)
        scaled = jax.jit(lambda p: {name: (codec.encode(p * x, key, shared),
                                           p * codec.encode(x, key, shared))
                                    for name, codec in EVERY.items()})
        for p in (0.37, 2.5):
            for name, (a, b) in scaled(p).items():
                np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-13, err_msg=name)


def feedback_message(seed):
    rng = np.random.default_rng(seed)
    message = {"w": jnp.asarray(rng.normal(size=(3, 4))), "b": jnp.asarray(rng.normal(size=5)),
               "s": jnp.asarray(rng.normal()), "one": jnp.asarray(rng.normal(size=(1,))),
               "n": jnp.arange(4)}
    # compressed, in leaf order (b, n, one, s, w): b and w; the others go as they are
    residual = (jnp.asarray(rng.normal(size=5)), jnp.asarray(rng.normal(size=(3, 4))))
    return message, residual


P = 0.3


@pytest.fixture(scope="module")
def feedback():
    """For every compressor, in one program: encode_message with residual and weight P, with
    weight 0 (a zero message), and without a residual; and C of each compressed tensor's
    m + P e with its own fold of the keys (b is leaf 0, w leaf 4)."""
    with jax.enable_x64(True):
        message, old = feedback_message(5)
        key, shared = jax.random.PRNGKey(7), jax.random.PRNGKey(8)
        zero = jax.tree.map(jnp.zeros_like, message)

        def every():
            out = {}
            for name, codec in EVERY.items():
                own = {part: codec.encode((message[part] + P * e).reshape(-1),
                                          jax.random.fold_in(key, i),
                                          jax.random.fold_in(shared, i))
                       for i, part, e in ((0, "b", old[0]), (4, "w", old[1]))}
                plain_w = codec.encode(message["w"].reshape(-1), jax.random.fold_in(key, 4),
                                       jax.random.fold_in(shared, 4))
                out[name] = (encode_message(codec, message, key, shared, old, jnp.float64(P)),
                             encode_message(codec, zero, key, shared, old, jnp.float64(0.0)),
                             encode_message(codec, message, key, shared), own, plain_w)
            return out

        return jax.device_get((message, old, jax.jit(every)()))


@pytest.mark.parametrize("name", sorted(EVERY))
def test_error_feedback_sent_plus_weighted_residual_is_the_message_plus_old_residual(feedback,
                                                                                     name):
    message, old, out = feedback
    (sent, new), (_, kept), (plain, none), own, plain_w = out[name]
    assert len(new) == 2
    for before, after in zip(old, new):
        assert after.shape == before.shape and after.dtype == np.float64
    np.testing.assert_allclose(sent["b"] + P * new[0], message["b"] + P * old[0], rtol=0,
                               atol=1e-12)
    np.testing.assert_allclose(sent["w"] + P * new[1], message["w"] + P * old[1], rtol=0,
                               atol=1e-12)
    # what is sent is C(m + p e) of each tensor, flattened, with its own fold of the keys
    for part in ("b", "w"):
        np.testing.assert_allclose(sent[part].reshape(-1), own[part], rtol=0, atol=1e-13)
    for part in ("s", "one", "n"):                  # one-entry and integer tensors: as they are
        np.testing.assert_array_equal(sent[part], message[part])
    if name != "random_k(0.25,unbiased)":           # (d/k > 1/p: its residual can be anything)
        assert max(np.abs(a - b).max() for a, b in zip(new, old)) > 1e-3
    # weight 0 (a slot that did not join): the residual is kept as it was
    for a, b in zip(kept, old):
        np.testing.assert_array_equal(a, b)
    # without a residual, no feedback: what is sent is C(m)
    assert none == ()
    np.testing.assert_allclose(plain["w"].reshape(-1), plain_w, rtol=0, atol=1e-13)


# --- bits ---------------------------------------------------------------------------------------

def test_bit_counts_are_the_docstring_formulas_by_hand():
    assert top_k(0.1).bits(100, 32) == 10 * (32 + 7)               # k = 10, ceil(log2 100) = 7
    assert top_k(0.3).bits(7, 64) == 3 * (64 + 3)                  # k = ceil(2.1) = 3
    assert top_k(0.07).bits(100, 32) == 7 * (32 + 7)               # 0.07 * 100 is 7
    assert top_k(1.0).bits(1, 32) == 1 * (32 + 0)                  # no index among 1
    assert random_k(0.25).bits(10, 32) == 3 * 32 + 32              # k = ceil(2.5) = 3, a seed
    assert random_k(0.25, unbiased=True).bits(10, 32) == 3 * 32 + 32
    assert qsgd(1, bucket_size=4).bits(10, 32) == 3 * 32 + 10 * 2  # 3 norms; 3 symbols: 2 bits
    assert qsgd(4).bits(10, 32) == 32 + 10 * 4                     # 9 symbols: 4 bits
    assert qsgd(2, bucket_size=64).bits(10, 32) == 32 + 10 * 3     # one bucket; 5 symbols: 3 bits
    assert scaled_sign().bits(10, 32) == 10 + 32
    assert rotated_uniform(2).bits(10, 32) == 16 * 2 + 2 * 32      # d' = 16
    assert rotated_uniform(3).bits(16, 64) == 16 * 3 + 2 * 64


def top_k_bits_by_hand(size, ratio=0.1, width=32):
    """k (width + ceil(log2 d)) for a tensor of ``size`` > 1 entries, else the raw value."""
    if size == 1:
        return width
    return math.ceil(Fraction(str(ratio)) * size) * (width + math.ceil(math.log2(size)))


def test_client_bits_sum_each_tensors_encoding_and_the_downlink_is_the_model():
    """{a: 10x10, b: 7, c: scalar, d: 1x1}: top-k(0.1) sends 10 (32 + 7) + 1 (32 + 3) + 32 + 32
    bits; the downlink is the 109 float32s of the model. SCAFFOLD sends its update and control
    variate (two model-sized messages) and receives two models."""
    params = {"a": jnp.zeros((10, 10)), "b": jnp.zeros(7), "c": jnp.zeros(()),
              "d": jnp.zeros((1, 1))}
    model_bits = 109 * 32
    up = 10 * (32 + 7) + 1 * (32 + 3) + 32 + 32
    assert up == sum(top_k_bits_by_hand(leaf.size) for leaf in jax.tree.leaves(params))
    local = algorithms.local_sgd(0.1)
    for error_feedback in (False, True):
        alg = algorithms.compress(algorithms.fedavg(local), "top_k", ratio=0.1,
                                  error_feedback=error_feedback)
        assert client_bits(alg, 0, params) == (model_bits, up)
        assert client_bits(alg, 5, params) == (model_bits, up)
    assert client_bits(algorithms.fedavg(local), 0, params) == (model_bits, model_bits)
    scaffold = algorithms.compress(algorithms.scaffold(local), "top_k", ratio=0.1)
    assert client_bits(scaffold, 0, params) == (2 * model_bits, 2 * up)
    quantized = algorithms.fedpaq(local, levels=4, bucket_size=8)
    # a: 13 buckets of 8 (one of 4); b: 1; c, d raw; 9 symbols: 4 bits each
    assert client_bits(quantized, 0, params) == (model_bits, (13 + 1) * 32 + (100 + 7) * 4 + 64)
    # dp around compress: the compressed size is what goes up
    private = algorithms.dp(algorithms.compress(algorithms.fedavg(local), "scaled_sign"), 0.5,
                            1.0, 3)
    assert client_bits(private, 0, params) == (model_bits, (100 + 32) + (7 + 32) + 64)


@pytest.fixture(scope="module")
def compressed_run(tmp_path_factory):
    """3 rounds on digits of FedAvg + top-k(0.1) + error feedback, with user-level DP around it
    (the config's order: dp(compress(fedavg))); 4 clients a round."""
    out = tmp_path_factory.mktemp("compressed")
    config = fljax.ExperimentConfig(
        rounds=3, eval_every=3, num_clients=10, clients_per_round=4, local_steps=2,
        local_epochs=None, out_dir=str(out), wrappers=json.dumps({
            "compress": {"compressor": "top_k", "ratio": 0.1, "error_feedback": True},
            "dp": {"clip_norm": 0.5, "noise_multiplier": 0.5}}))
    evaluations = fljax.run(config, progress=False)
    records = [json.loads(line) for line in open(os.path.join(config.out_dir, "metrics.jsonl"))]
    return config, evaluations, [r for r in records if r["kind"] == "round"]


def test_a_compressed_run_logs_each_rounds_bits_and_their_totals(compressed_run):
    """Each round: 4 x the top-k encoding of every tensor up, 4 models down; the last evaluation's
    totals are the sums over the rounds."""
    config, evaluations, rounds = compressed_run
    ds = fljax.load_dataset("digits")
    model = fljax.make_model("mlp", ds.x_train.shape[1:], ds.num_classes)
    shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0))
    sizes = [leaf.size for leaf in jax.tree.leaves(shapes)]
    per_client_up = sum(top_k_bits_by_hand(n) for n in sizes)
    model_bits = 32 * sum(sizes)
    assert per_client_up < model_bits / 4
    assert [r["round"] for r in rounds] == [1, 2, 3]
    for r in rounds:
        assert r["bits_up"] == 4 * per_client_up
        assert r["bits_down"] == 4 * model_bits
        assert r["bytes_up"] == r["bits_up"] / 8
    last = evaluations[-1]
    assert last["uplink_bits"] == sum(r["bits_up"] for r in rounds) == 12 * per_client_up
    assert last["downlink_bits"] == 12 * model_bits
    assert last["bytes"] == (last["uplink_bits"] + last["downlink_bits"]) / 8


def test_dp_around_compress_from_the_config_runs_and_is_finite(compressed_run):
    config, evaluations, rounds = compressed_run
    assert all(math.isfinite(r["train_loss"]) and r["clip_norm"] == 0.5 for r in rounds)
    assert math.isfinite(evaluations[-1]["loss"])
    assert 0 < evaluations[-1]["epsilon"] < math.inf


# --- reductions ---------------------------------------------------------------------------------

def train(alg, rounds=3, participation="uniform", aggregation="examples", seed=3):
    """``rounds`` rounds of ``alg`` on the tiny problem in float64; the final state."""
    x, y, parts, model = tiny_problem()
    with jax.enable_x64(True):
        params = jax.tree.map(lambda a: np.asarray(a, np.float64),
                              model.init(jax.random.PRNGKey(1)))
        round_fn = make_round(alg, model, federate(x, y, parts, NUM_CLASSES),
                              clients_per_round=COHORT, batch_size=BATCH, local_steps=STEPS,
                              participation=participation, aggregation=aggregation)
        state = init_state(alg, params, len(parts), seed=seed)
        for _ in range(rounds):
            state, metrics = round_fn(state)
            assert bool(metrics["params_finite"])
        return jax.device_get(state), params


def assert_same_params(a, b, tol=1e-12):
    for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(u, v, rtol=tol, atol=tol)


@functools.lru_cache(maxsize=None)
def plain_fedavg():
    """3 rounds of uncompressed FedAvg (shared by the tests that compare with it)."""
    return train(algorithms.fedavg(algorithms.local_sgd(LR)))


def test_top_k_of_every_coordinate_is_fedavg():
    plain, start = plain_fedavg()
    assert global_norm(tree_map(lambda a, b: a - b, plain.params, start)) > 1e-2
    for error_feedback in (False, True):
        got, _ = train(algorithms.compress(algorithms.fedavg(algorithms.local_sgd(LR)), "top_k",
                                           ratio=1.0, error_feedback=error_feedback))
        assert_same_params(got.params, plain.params)
        if error_feedback:
            for residual in got.client_states.residual:       # nothing was ever left behind
                np.testing.assert_array_equal(residual, 0)


def test_top_k_of_every_coordinate_is_scaffold():
    """SCAFFOLD's two-part message (update and control variate), each with its residual."""
    plain, _ = train(algorithms.scaffold(algorithms.local_sgd(LR)))
    got, _ = train(algorithms.compress(algorithms.scaffold(algorithms.local_sgd(LR)), "top_k",
                                       ratio=1.0, error_feedback=True))
    assert_same_params(got.params, plain.params)
    assert_same_params(got.server_state, plain.server_state)       # the server's control variate
    assert_same_params(got.client_states.inner, plain.client_states)
    assert len(got.client_states.residual) == 2 * len(jax.tree.leaves(plain.params))
    for residual in got.client_states.residual:
        np.testing.assert_array_equal(residual, 0)
    assert global_norm(plain.server_state) > 0


# --- float64 end-to-end reference ---------------------------------------------------------------

def compressed_fedavg_reference(params, x, y, parts, *, seed, rounds, participation, encode):
    """FedAvg whose client i sends C(p_i Delta_i + p_i e_i) and keeps e_i <- (x - C(x)) / p_i per
    tensor (error feedback, the residual per unit of weight); w <- w - sum_S C(x_i). ``encode(x,
    key, shared_key)``: C of one flat tensor, keyed by fljax's message keys folded with the
    tensor's index. Returns the model and every client's residual."""
    w = tree_map(lambda a: np.asarray(a, np.float64), params)
    counts = np.array([len(p) for p in parts])
    key = jax.random.PRNGKey(seed)
    residuals = [tree_map(np.zeros_like, w) for _ in parts]
    for t in range(rounds):
        schedule = list(client_schedule(key, t, COHORT, counts, BATCH, STEPS, None, counts.max(),
                                        participation))
        if not schedule:
            continue
        ids = [cid for cid, _ in schedule]
        p = counts[ids] / counts[ids].sum()
        _, client_key = round_key(key, t)
        total = tree_map(np.zeros_like, w)
        for weight, (cid, steps) in zip(p, schedule):
            local = local_sgd(w, steps, parts[cid], x, y, LR)
            own, shared = message_keys(client_key, cid)
            deltas, treedef = jax.tree.flatten(tree_map(lambda a, b: a - b, w, local))
            sent, kept = [], []
            for i, (delta, e) in enumerate(zip(deltas, jax.tree.leaves(residuals[cid]))):
                v = weight * delta + weight * e
                c = encode(v.reshape(-1), jax.random.fold_in(own, i),
                           jax.random.fold_in(shared, i)).reshape(v.shape)
                sent.append(c)
                kept.append((v - c) / weight)
            residuals[cid] = treedef.unflatten(kept)
            total = tree_map(np.add, total, treedef.unflatten(sent))
        w = tree_map(lambda a, s: a - s, w, total)
    return w, residuals


@pytest.mark.parametrize("compressor,participation", [
    ("top_k", "uniform"), ("qsgd", "bernoulli")])
def test_fedavg_with_error_feedback_matches_float64_reference(compressor, participation):
    """Top-k(0.3) with fixed-size cohorts, QSGD(2, buckets of 4) under Bernoulli participation
    (the cohort size and so p_i change between rounds); 4 rounds, examples-weighted, 3 of 6
    clients: residuals carry over the rounds a client sits out."""
    x, y, parts, _ = tiny_problem()
    if compressor == "top_k":
        alg = algorithms.compress(algorithms.fedavg(algorithms.local_sgd(LR)), "top_k",
                                  ratio=0.3, error_feedback=True)
        encode = lambda v, k, s: top_k_ref(v, 0.3)
    else:
        alg = algorithms.compress(algorithms.fedavg(algorithms.local_sgd(LR)), "qsgd", levels=2,
                                  bucket_size=4, error_feedback=True)
        encode = lambda v, k, s: qsgd_ref(v, 2, 4, k)
    state, params = train(alg, rounds=4, participation=participation)
    with jax.enable_x64(True):
        expected, residuals = compressed_fedavg_reference(
            params, x, y, parts, seed=3, rounds=4, participation=participation, encode=encode)
    assert_same_params(state.params, expected)
    got = state.client_states.residual               # per tensor, stacked over the 6 clients
    for cid, mine in enumerate(residuals):
        for leaf, ref in zip(got, jax.tree.leaves(mine)):
            np.testing.assert_allclose(leaf[cid], ref, rtol=1e-12, atol=1e-12)
    norms = [global_norm(r) for r in residuals]
    assert sum(n > 1e-3 for n in norms) >= 4                 # most clients carry a residual
    assert global_norm(tree_map(lambda a, b: a - b, expected, params)) > 1e-2


# --- composition --------------------------------------------------------------------------------

def test_compress_refuses_to_wrap_dp():
    private = algorithms.dp(algorithms.fedavg(algorithms.local_sgd(0.1)), 0.5, 1.0, 3)
    with pytest.raises(FljaxError, match="wrap dp around compress") as error:
        algorithms.compress(private, "top_k", ratio=0.1)
    assert "\n" not in str(error.value)


def test_compressed_runs_with_error_feedback_batched_equal_alone():
    """QSGD's keys and every client's residual: each run its own, in the batch as alone."""
    build = lambda h: algorithms.compress(algorithms.fedavg(algorithms.local_sgd(h["lr"])),
                                          "qsgd", levels=2, bucket_size=4, error_feedback=True)
    state = compare(build, {"lr": [0.3, 0.1]}, [0, 1], local_steps=2, local_epochs=None,
                    rounds=2)
    assert np.abs(state.client_states.residual[0]).max() > 0


def test_fedpaq_is_fedavg_with_qsgd():
    local = algorithms.local_sgd(LR)
    paq, _ = train(algorithms.fedpaq(local, levels=3, bucket_size=5))
    same, _ = train(algorithms.compress(algorithms.fedavg(local), "qsgd", levels=3,
                                        bucket_size=5))
    for a, b in zip(jax.tree.leaves(paq.params), jax.tree.leaves(same.params)):
        np.testing.assert_array_equal(a, b)
    plain, _ = plain_fedavg()                                # and the quantization did something
    assert global_norm(tree_map(lambda a, b: a - b, paq.params, plain.params)) > 1e-3


def test_fedpaq_from_the_config_sends_qsgd_bits():
    """--algorithm fedpaq --algorithm-args '{"levels": 4}': QSGD(4) on each tensor of the MLP,
    one norm and a 4-bit symbol (9 symbols) per value; levels 0 is refused when it is built."""
    ds = fljax.load_dataset("digits")
    model = fljax.make_model("mlp", ds.x_train.shape[1:], ds.num_classes)
    sizes = [leaf.size for leaf in jax.tree.leaves(jax.eval_shape(model.init,
                                                                  jax.random.PRNGKey(0)))]
    config = fljax.ExperimentConfig(algorithm="fedpaq", algorithm_args='{"levels": 4}')
    config.validate()
    alg = build_algorithm(config, model)
    params = jax.eval_shape(model.init, jax.random.PRNGKey(0))
    assert client_bits(alg, 0, params) == (32 * sum(sizes), sum(32 + 4 * n for n in sizes))
    bad = fljax.ExperimentConfig(algorithm="fedpaq", algorithm_args='{"levels": 0}')
    with pytest.raises(FljaxError, match=re.escape("levels must be a whole number >= 1, got 0")):
        bad.validate()
        build_algorithm(bad, model)


def test_the_share_top_k_keeps_is_structure_not_a_traced_hyperparameter():
    """k = ceil(ratio d) is a shape: two ratios are two programs (a sweep never traces it), while
    dp's clip norm beside it can be traced."""
    config = lambda ratio: fljax.ExperimentConfig(rounds=2, wrappers=json.dumps({
        "compress": {"compressor": "top_k", "ratio": ratio},
        "dp": {"clip_norm": 0.5, "noise_multiplier": 1.0}}))
    assert not grouping.traceable(config(0.1), "wrappers.compress.ratio")
    assert grouping.traceable(config(0.1), "wrappers.dp.clip_norm")
    assert grouping.structure(config(0.1)) != grouping.structure(config(0.2))


# --- bad input ----------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,message", [
    (dict(compressor="nope"), "unknown compressor 'nope'"),
    (dict(compressor="top_k", ratio=0), "ratio must be a number in (0, 1]"
                                        " (the share of coordinates kept), got 0"),
    (dict(compressor="random_k", ratio=1.5), "ratio must be a number in (0, 1] "
                                             "(the share of coordinates kept), got 1.5"),
    (dict(compressor="top_k"), "compressor 'top_k' needs ['ratio']"),
    (dict(compressor="qsgd", levels=0), "levels must be a whole number >= 1, got 0"),
    (dict(compressor="qsgd", levels=2.5), "levels must be a whole number >= 1, got 2.5"),
    (dict(compressor="qsgd", levels=2, bucket_size=0),
     "bucket_size must be a whole number >= 1, got 0"),
    (dict(compressor="top_k", ratio=0.1, levels=4), "compressor 'top_k' does not take ['levels']"),
    (dict(compressor="scaled_sign", unbiased=True),
     "compressor 'scaled_sign' does not take ['unbiased']"),
    (dict(compressor="rotated_uniform", bits=0), "bits must be a whole number >= 1, got 0"),
    (dict(compressor="top_k", ratio=0.1, error_feedback="yes"),
     "error_feedback must be true or false, got 'yes'"),
])
def test_bad_compression_settings_are_one_line_errors(kwargs, message):
    with pytest.raises(FljaxError) as error:
        algorithms.compress(algorithms.fedavg(algorithms.local_sgd(0.1)), **kwargs)
    assert message in str(error.value) and "\n" not in str(error.value), str(error.value)


def test_make_builds_each_compressor_by_name():
    assert make("top_k", ratio=0.5).name == "top_k(0.5)"
    assert make("random_k", ratio=0.5, unbiased=True).unbiased
    assert make("qsgd", levels=2, bucket_size=None).bits(10, 32) == 32 + 10 * 3
    assert make("rotated_uniform", bits=1).unbiased and not make("scaled_sign").unbiased


def test_cli_bad_compression_is_one_line_exit_2(tmp_path, capsys):
    code = main(["--rounds", "2", "--out-dir", str(tmp_path / "run"), "--wrappers",
                 '{"compress": {"compressor": "nope"}}'])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    lines = err.splitlines()
    assert len(lines) == 1 and "unknown compressor 'nope'" in lines[0], err
    assert not (tmp_path / "run").exists()                  # refused before anything is written


@pytest.mark.parametrize("wrapper,message", [
    ({"compressor": "top_k", "ratio": 0.1, "error_feedback": "yes"},
     'error_feedback must be true or false, got "yes"'),
    ({"compressor": "top_k", "ratio": "0.1"}, 'ratio must be a number or null, got "0.1"'),
    ({"compressor": "top_k", "ratio": 0.1, "nope": 1}, "wrapper 'compress' does not take ['nope']"),
])
def test_bad_compress_wrapper_in_the_config_is_refused(tmp_path, wrapper, message):
    config = fljax.ExperimentConfig(rounds=2, out_dir=str(tmp_path / "run"),
                                    wrappers=json.dumps({"compress": wrapper}))
    with pytest.raises(FljaxError) as error:
        config.validate()
    assert message in str(error.value) and "\n" not in str(error.value), str(error.value)
