"""Models: conv implementations agree, parameter counts match the papers, groups and features."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from fljax import FljaxError
from fljax.models import ConvNet, from_module, im2col_conv, make_model, max_pool, num_params


@pytest.mark.parametrize("padding", ["VALID", "SAME", ((1, 2), (0, 1))])
@pytest.mark.parametrize("strides", [(1, 1), (2, 1)])
def test_im2col_conv_equals_xla_conv(padding, strides):
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 9, 7, 3))
    k = jax.random.normal(jax.random.PRNGKey(1), (3, 5, 3, 4))
    dn = ("NHWC", "HWIO", "NHWC")
    expected = lax.conv_general_dilated(x, k, strides, padding, dimension_numbers=dn)
    got = im2col_conv(x, k, strides, padding, dimension_numbers=dn)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_max_pool_floor_mode():
    x = jnp.arange(2 * 5 * 5 * 1, dtype=jnp.float32).reshape(2, 5, 5, 1)
    expected = lax.reduce_window(x[:, :4, :4], -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1),
                                 "VALID")
    np.testing.assert_array_equal(max_pool(x), expected)


@pytest.mark.parametrize("name, shape, classes, count", [
    ("standard_cnn", (32, 32, 3), 10, 797_962),   # FedDyn / FedBug code, 10 classes
    ("standard_cnn", (32, 32, 3), 100, 815_332),  # ... 100 classes
    ("mlp", (28, 28, 1), 10, 199_210),            # McMahan et al.'s 2NN
])
def test_parameter_counts(name, shape, classes, count):
    model = make_model(name, shape, classes)
    assert num_params(model.init(jax.random.PRNGKey(0))) == count


def test_fedga_emnist_cnn_parameter_count():
    model = from_module("fedga_cnn", ConvNet(channels=(32, 64), hidden=(), num_classes=47),
                        (28, 28, 1), 47)
    assert num_params(model.init(jax.random.PRNGKey(0))) == 100_271


def test_groups_features_and_conv_impls_agree():
    fast = make_model("standard_cnn", (32, 32, 3), 10, conv_impl="im2col")
    native = make_model("standard_cnn", (32, 32, 3), 10, conv_impl="xla")
    assert fast.groups == ("conv1", "conv2", "fc1", "fc2", "fc3")
    params = fast.init(jax.random.PRNGKey(0))
    x = jax.random.normal(jax.random.PRNGKey(1), (4, 32, 32, 3))
    features, logits = fast.apply_with_features(params, x)
    assert features.shape == (4, 192) and logits.shape == (4, 10)
    np.testing.assert_allclose(logits, native.apply(params, x), rtol=1e-4, atol=1e-5)


def test_torch_style_init_bounds():
    params = make_model("standard_cnn", (32, 32, 3), 10).init(jax.random.PRNGKey(0))
    bound = 1 / np.sqrt(5 * 5 * 3)
    for leaf in (params["conv1"]["kernel"], params["conv1"]["bias"]):
        assert np.abs(leaf).max() <= bound and np.abs(leaf).max() > 0.9 * bound


def test_bad_model_arguments():
    with pytest.raises(FljaxError, match="unknown model 'resnet1'"):
        make_model("resnet1", (32, 32, 3), 10)
    with pytest.raises(FljaxError, match="conv_impl must be one of"):
        make_model("small_cnn", (28, 28, 1), 10, conv_impl="cudnn")
    with pytest.raises(FljaxError, match="at least 13x13"):
        make_model("small_cnn", (8, 8, 1), 10)


def test_cnn1d_is_the_mnist1d_cnn():
    """ConvBase of the mnist1d code: torch Conv1d(1, 25, 5, stride 2, padding 1), two
    Conv1d(25, 25, 3, stride 2, padding 1), ReLUs, Linear(125, 10); checked against numpy."""
    model = make_model("cnn1d", (40, 1), 10)
    assert model.groups == ("conv1", "conv2", "conv3", "linear")
    params = model.init(jax.random.PRNGKey(0))
    assert num_params(params) == 5_210
    x = np.asarray(jax.random.normal(jax.random.PRNGKey(1), (3, 40, 1)), np.float64)
    h = x
    for name in ("conv1", "conv2", "conv3"):
        kernel = np.asarray(params[name]["kernel"], np.float64)[:, 0]   # [k, C_in, C_out]
        padded = np.pad(h, ((0, 0), (1, 1), (0, 0)))
        length = (padded.shape[1] - len(kernel)) // 2 + 1
        h = np.maximum(0, np.stack([np.einsum("nkc,kco->no", padded[:, 2 * t:2 * t + len(kernel)],
                                              kernel) for t in range(length)], axis=1)
                       + np.asarray(params[name]["bias"]))
    assert h.shape == (3, 5, 25)
    features = h.reshape(3, -1)
    logits = features @ np.asarray(params["linear"]["kernel"]) + np.asarray(params["linear"]["bias"])
    for impl in ("im2col", "xla"):
        got_features, got_logits = make_model("cnn1d", (40, 1), 10, conv_impl=impl
                                              ).apply_with_features(params, x.astype(np.float32))
        np.testing.assert_allclose(got_features, features, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(got_logits, logits, rtol=1e-4, atol=1e-5)


def test_input_shapes_by_model_kind():
    assert make_model("mlp", (60,), 10).input_shape == (60,)           # Synthetic's vectors
    assert make_model("linear", (40, 1), 10).input_shape == (40, 1)
    with pytest.raises(FljaxError, match=r"signals \[L, C\] of length at least 3, got \(8, 8, 1\)"):
        make_model("cnn1d", (8, 8, 1), 10)
    with pytest.raises(FljaxError, match="at least 13x13 pixels, got \\(40, 1\\)"):
        make_model("small_cnn", (40, 1), 10)
