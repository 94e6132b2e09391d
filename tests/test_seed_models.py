"""The seed papers' models: torch parameter counts, shapes, features, FedBug units, conv impls."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from fljax import FljaxError
from fljax.models import ResNet, from_module, make_model, max_pool, num_params, unfreeze_units
from fljax.models.heads import with_projection_head
from fljax.models.layers import group_norm, kaiming_normal, torch_kernel_init


def conv_count(k, cin, cout, bias=False):
    return k * k * cin * cout + (cout if bias else 0)


def linear_count(fan_in, fan_out):
    return fan_in * fan_out + fan_out


def resnet_count(stage_sizes, widths, classes, stem_kernel, conv_shortcut, in_channels=3):
    """torch count of a BasicBlock ResNet; GroupNorm(2, C) has 2C parameters, as BatchNorm."""
    count = conv_count(stem_kernel, in_channels, widths[0]) + 2 * widths[0]
    cin = widths[0]
    for stage, (blocks, width) in enumerate(zip(stage_sizes, widths)):
        for block in range(blocks):
            count += conv_count(3, cin, width) + conv_count(3, width, width) + 4 * width
            if conv_shortcut and (cin != width or (stage > 0 and block == 0)):
                count += conv_count(1, cin, width) + 2 * width
            cin = width
    return count + linear_count(cin, classes)


def vgg11_count(classes):
    widths = [3, 64, 128, 256, 256, 512, 512, 512, 512]
    convs = sum(conv_count(3, a, b, bias=True) for a, b in zip(widths, widths[1:]))
    return convs + linear_count(512, 512) * 2 + linear_count(512, classes)


def shape_params(model):
    return jax.eval_shape(model.init, jax.random.key(0))


def init(model):
    """Compiled init; the rbg key's generator compiles ~3x faster than threefry on CPU."""
    return jax.jit(model.init)(jax.random.key(0, impl="unsafe_rbg"))


@functools.lru_cache(maxsize=None)
def built(name, shape, classes, conv_impl="im2col"):
    """(model, params, a batch of 2 inputs), built once per test session."""
    model = make_model(name, shape, classes, conv_impl=conv_impl)
    x = jax.random.normal(jax.random.PRNGKey(1), (2, *shape))
    return model, init(model), x


@pytest.mark.parametrize("name, shape, classes, count", [
    ("resnet18_gn", (32, 32, 3), 10, resnet_count((2, 2, 2, 2), (64, 128, 256, 512), 10, 7, True)),
    ("resnet34_gn", (32, 32, 3), 10, resnet_count((3, 4, 6, 3), (64, 128, 256, 512), 10, 7, True)),
    ("resnet34_gn", (64, 64, 3), 200,
     resnet_count((3, 4, 6, 3), (64, 128, 256, 512), 200, 7, True)),
    ("resnet20", (32, 32, 3), 100, resnet_count((3, 3, 3), (16, 32, 64), 100, 3, False)),
    ("resnet20", (32, 32, 3), 10, resnet_count((3, 3, 3), (16, 32, 64), 10, 3, False)),
    ("vgg11", (32, 32, 3), 10, vgg11_count(10)),
    ("emnist_cnn", (28, 28, 1), 47,
     conv_count(5, 1, 32, True) + conv_count(5, 32, 64, True) + linear_count(4 * 4 * 64, 47)),
    ("mnist_net", (28, 28, 1), 10, conv_count(3, 1, 32, True) + conv_count(3, 32, 64, True)
     + linear_count(9216, 128) + linear_count(128, 10)),
])
def test_parameter_counts_match_torch(name, shape, classes, count):
    assert num_params(shape_params(make_model(name, shape, classes))) == count


def test_known_parameter_counts():
    # torchvision resnet18 / resnet34 (11,689,512 / 21,797,672 with the 1000-class fc) with a
    # 10-class fc; He et al.'s ResNet-20 (0.27M); FedNova's vgg11; FedGA's cnn_mnist.
    assert resnet_count((2, 2, 2, 2), (64, 128, 256, 512), 1000, 7, True) == 11_689_512
    assert resnet_count((3, 4, 6, 3), (64, 128, 256, 512), 1000, 7, True) == 21_797_672
    assert resnet_count((2, 2, 2, 2), (64, 128, 256, 512), 10, 7, True) == 11_181_642
    assert resnet_count((3, 4, 6, 3), (64, 128, 256, 512), 10, 7, True) == 21_289_802
    assert resnet_count((3, 3, 3), (16, 32, 64), 10, 3, False) == 269_722
    assert vgg11_count(10) == 9_750_922
    assert num_params(shape_params(make_model("emnist_cnn", (28, 28, 1), 47))) == 100_271


@pytest.mark.parametrize("name, shape, classes, width", [
    ("resnet18_gn", (32, 32, 3), 10, 512),
    ("resnet34_gn", (64, 64, 3), 200, 512),
])
def test_big_resnet_shapes(name, shape, classes, width):
    model = make_model(name, shape, classes)
    x = jax.ShapeDtypeStruct((2, *shape), jnp.float32)
    features, logits = jax.eval_shape(model.apply_with_features, shape_params(model), x)
    assert features.shape == (2, width) and logits.shape == (2, classes)


@pytest.mark.parametrize("name, shape, classes, width", [
    ("resnet20", (32, 32, 3), 100, 64),
    ("vgg11", (32, 32, 3), 10, 512),
    ("emnist_cnn", (28, 28, 1), 47, 1024),
])
def test_forward_shapes_and_features(name, shape, classes, width):
    model, params, x = built(name, shape, classes)
    features, logits = model.apply_with_features(params, x)
    assert features.shape == (2, width) and logits.shape == (2, classes)
    assert np.all(np.isfinite(logits))
    np.testing.assert_array_equal(model.apply(params, x), logits)


def test_mnist_net_is_karimireddy_et_al_s_network():
    """Eval mode against a float64 numpy forward of the code's Net (no ReLU after conv2); in
    training the first dropout drops whole channels, the second single units."""
    from fljax.models.zoo import TorchMnistNet
    model, params, x = built("mnist_net", (28, 28, 1), 10)
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    h = np.asarray(x, np.float64)

    def conv_valid(h, layer):
        windows = np.lib.stride_tricks.sliding_window_view(h, (3, 3), axis=(1, 2))
        return np.einsum("nhwcij,ijco->nhwo", windows, layer["kernel"]) + layer["bias"]

    h = conv_valid(np.maximum(conv_valid(h, p["conv1"]), 0), p["conv2"])
    h = h.reshape(2, 12, 2, 12, 2, 64).max(axis=(2, 4)).reshape(2, -1)
    h = np.maximum(h @ p["fc1"]["kernel"] + p["fc1"]["bias"], 0)
    np.testing.assert_allclose(model.apply(params, x), h @ p["fc2"]["kernel"] + p["fc2"]["bias"],
                               rtol=2e-4, atol=2e-5)
    _, seen = TorchMnistNet(num_classes=10).apply(
        {"params": params}, x, train=True, rngs={"dropout": jax.random.PRNGKey(4)},
        capture_intermediates=True)
    after_conv = np.asarray(seen["intermediates"]["Dropout_0"]["__call__"][0])
    zero_share = (after_conv == 0).mean(axis=(1, 2))      # [N, 64]: per example and channel
    assert set(np.unique(zero_share)) == {0.0, 1.0}
    after_fc = np.asarray(seen["intermediates"]["Dropout_1"]["__call__"][0])
    assert 0.3 < (after_fc == 0).mean() < 0.8


def test_vgg_dropout_only_in_training():
    model, params, x = built("vgg11", (32, 32, 3), 10)
    a = model.apply(params, x, train=True, rng=jax.random.PRNGKey(2))
    b = model.apply(params, x, train=True, rng=jax.random.PRNGKey(3))
    assert not np.allclose(a, b)
    np.testing.assert_array_equal(model.apply(params, x), model.apply(params, x, train=False))


RESNET18_B = (("stem", "layer1_0"), ("layer1_1",), ("layer2_0",), ("layer2_1",), ("layer3_0",),
              ("layer3_1",), ("layer4_0",), ("layer4_1", "fc"))
RESNET34_B = (("stem", "layer1_0"), ("layer1_1",), ("layer1_2",),
              *((f"layer2_{i}",) for i in range(4)), *((f"layer3_{i}",) for i in range(6)),
              ("layer4_0",), ("layer4_1",), ("layer4_2", "fc"))


def test_groups_and_fedbug_units():
    """FedBug utils_gu.py: 'M' unfreezes stem+layer1, layer2, layer3, layer4+fc; 'B' one block."""
    r18 = make_model("resnet18_gn", (32, 32, 3), 10)
    assert r18.groups == tuple(g for unit in RESNET18_B for g in unit)
    assert unfreeze_units(r18, "B") == RESNET18_B
    assert unfreeze_units(r18, "M") == (("stem", "layer1_0", "layer1_1"), ("layer2_0", "layer2_1"),
                                        ("layer3_0", "layer3_1"), ("layer4_0", "layer4_1", "fc"))
    r34 = make_model("resnet34_gn", (32, 32, 3), 100)
    assert len(RESNET34_B) == 16 and unfreeze_units(r34, "B") == RESNET34_B
    assert r34.groups == tuple(g for unit in RESNET34_B for g in unit)
    assert [len(u) for u in unfreeze_units(r34, "M")] == [4, 4, 6, 4]
    cnn = make_model("standard_cnn", (32, 32, 3), 10)
    for unit in ("M", "B"):
        assert unfreeze_units(cnn, unit) == (("conv1",), ("conv2",), ("fc1",), ("fc2",), ("fc3",))
    tiny = make_model("tiny_cnn", (64, 64, 3), 200)    # FedBug utils_models.py / utils_gu.py
    shapes = {g: tuple(v["kernel"].shape) for g, v in tiny.init(jax.random.PRNGKey(0)).items()}
    assert (shapes["fc1"], shapes["fc2"], shapes["fc3"]) == ((1024, 256), (256, 128), (128, 200))
    for unit in ("M", "B"):     # 5 periods; conv3 is never frozen
        assert unfreeze_units(tiny, unit) == (("conv1", "conv3"), ("conv2",), ("fc1",), ("fc2",),
                                              ("fc3",))
    r20 = make_model("resnet20", (32, 32, 3), 100)
    assert len(unfreeze_units(r20, "B")) == 9 and len(unfreeze_units(r20, "M")) == 3
    assert with_projection_head(r20).groups[-4:] == ("layer3_2", "l1", "l2", "l3")  # fc dropped
    assert make_model("vgg11", (32, 32, 3), 10).groups == (
        *(f"conv{i}" for i in range(1, 9)), "fc1", "fc2", "fc3")


def test_torch_style_init():
    params = built("resnet20", (32, 32, 3), 100)[1]
    kernel = params["layer3_1"]["conv2"]["kernel"]  # 3x3x64x64, kaiming_normal fan_in
    assert abs(float(kernel.std()) / np.sqrt(2 / (9 * 64)) - 1) < 0.05
    np.testing.assert_array_equal(params["layer3_1"]["norm2"]["scale"], 1.0)
    np.testing.assert_array_equal(params["layer3_1"]["norm2"]["bias"], 0.0)
    assert "bias" not in params["layer3_1"]["conv2"]


def test_group_norm_is_torchs():
    """torch GroupNorm(2, C): each half of the channels normalised over (H, W, C/2), eps 1e-5."""
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 3, 3, 6)) * 3 + 1
    norm = group_norm("norm")
    got = norm.apply(norm.init(jax.random.PRNGKey(1), x), x)
    groups = x.reshape(2, 3, 3, 2, 3)
    mean = groups.mean(axis=(1, 2, 4), keepdims=True)
    var = groups.var(axis=(1, 2, 4), keepdims=True)
    expected = ((groups - mean) / jnp.sqrt(var + 1e-5)).reshape(x.shape)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_max_pool_with_padding_equals_reduce_window():
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 9, 8, 3))
    expected = lax.reduce_window(x, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 2, 2, 1),
                                 ((0, 0), (1, 1), (1, 1), (0, 0)))
    np.testing.assert_array_equal(max_pool(x, 3, 2, 1), expected)


def tiny_resnet(conv_impl, shortcut, imagenet_stem):
    module = ResNet((1, 2), (8, 16), 5, imagenet_stem=imagenet_stem, shortcut=shortcut,
                    conv_init=kaiming_normal("fan_out"), fc_init=torch_kernel_init(),
                    conv_impl=conv_impl)
    return from_module("tiny_resnet", module, (16, 16, 3), 5)


def test_im2col_equals_xla_on_imagenet_stem_and_downsample():
    fast, native = (tiny_resnet(impl, "conv", True) for impl in ("im2col", "xla"))
    params = init(fast)
    x = jax.random.normal(jax.random.PRNGKey(1), (2, 16, 16, 3))
    np.testing.assert_allclose(fast.apply(params, x), native.apply(params, x), rtol=1e-5, atol=1e-5)


def test_im2col_equals_xla_on_resnet20():
    fast, params, x = built("resnet20", (32, 32, 3), 100)
    native = built("resnet20", (32, 32, 3), 100, "xla")[0]
    f1, l1 = fast.apply_with_features(params, x)
    f2, l2 = native.apply_with_features(params, x)
    np.testing.assert_allclose(f1, f2, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(l1, l2, rtol=1e-5, atol=1e-5)


def test_bad_inputs():
    with pytest.raises(FljaxError, match=r"unfreeze unit must be one of \('M', 'B'\).*'L'"):
        unfreeze_units(make_model("resnet20", (32, 32, 3), 10), "L")
    with pytest.raises(FljaxError, match="'vgg11' needs images .* of at least 32x32"):
        make_model("vgg11", (28, 28, 1), 10)
    with pytest.raises(FljaxError, match="unknown model 'resnet50_gn'"):
        make_model("resnet50_gn", (32, 32, 3), 10)
    with pytest.raises(FljaxError, match=r"shortcut must be one of \('conv', 'pad'\), got 'B'"):
        tiny_resnet("im2col", "B", True).init(jax.random.PRNGKey(0))
