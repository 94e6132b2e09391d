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
