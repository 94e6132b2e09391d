"""The FedDyn code's CIFAR augmentation: per example a flip with probability 1/2 and, independently,
a zero-pad-4 random crop with probability 1/2; wired into the round by ``--augment flip_crop``."""

import jax
import numpy as np
import pytest

from fljax.runner.config import ExperimentConfig
from fljax.data.augment import flip_and_crop
from fljax.errors import FljaxError
from fljax.runner.train import run

PAD = 4


def images(n, h=8, w=8, c=2):
    """Distinct, nonzero values: every window and flip of an image is recognisable."""
    return np.arange(1, n * h * w * c + 1, dtype=np.float32).reshape(n, h, w, c)


def windows(image):
    """{(dy, dx): the H x W window of the zero-padded image at offset (dy, dx)}."""
    h, w, _ = image.shape
    padded = np.pad(image, ((PAD, PAD), (PAD, PAD), (0, 0)))
    return {(dy, dx): padded[dy:dy + h, dx:dx + w]
            for dy in range(2 * PAD + 1) for dx in range(2 * PAD + 1)}


def classify(original, out):
    """(flipped, crop offset) that turns ``original`` into ``out``; (4, 4) is no crop."""
    for flipped, source in ((False, original), (True, original[:, ::-1])):
        for offset, window in windows(source).items():
            if np.array_equal(window, out):
                return flipped, offset
    raise AssertionError("output is no flip / crop of its input")


def test_probability_zero_is_the_identity_and_one_always_flips():
    x = images(5)
    key = jax.random.PRNGKey(0)
    np.testing.assert_array_equal(flip_and_crop(crop_probability=0.0, flip_probability=0.0)(
        key, x), x)
    np.testing.assert_array_equal(flip_and_crop(crop_probability=0.0, flip_probability=1.0)(
        key, x), x[:, :, ::-1])


def test_flip_only_flips_half_and_never_crops():
    from fljax.data.augment import named_augmentation
    x = images(1200)
    out = np.asarray(named_augmentation("flip")(jax.random.PRNGKey(3), x))
    flipped = np.all(out == x[:, :, ::-1], axis=(1, 2, 3))
    assert np.all(flipped | np.all(out == x, axis=(1, 2, 3)))      # each one or the other
    assert 0.45 <= flipped.mean() <= 0.55


def test_every_output_is_a_flip_and_a_zero_padded_window_at_the_stated_rates():
    x = images(1200)
    out = np.asarray(flip_and_crop()(jax.random.PRNGKey(3), x))
    kinds = [classify(a, b) for a, b in zip(x, out)]
    flipped = np.mean([f for f, _ in kinds])
    cropped = np.mean([offset != (PAD, PAD) for _, offset in kinds])
    assert 0.45 <= flipped <= 0.55
    assert 0.44 <= cropped <= 0.54                     # 1/2 * 80/81: offset (4, 4) is no shift
    offsets = {offset for _, offset in kinds}
    assert len(offsets) == (2 * PAD + 1) ** 2          # every offset in {0..8}^2 occurs
    again = np.asarray(flip_and_crop()(jax.random.PRNGKey(3), x))
    np.testing.assert_array_equal(out, again)
    other = np.asarray(flip_and_crop()(jax.random.PRNGKey(4), x))
    assert not np.array_equal(out, other)


@pytest.mark.parametrize("kwargs, message", [
    (dict(flip_probability=1.5), "flip_probability must be in [0, 1], got 1.5"),
    (dict(crop_probability=-0.1), "crop_probability must be in [0, 1]"),
    (dict(pad=-1), "pad must be an integer >= 0"),
])
def test_bad_augmentation_arguments(kwargs, message):
    with pytest.raises(FljaxError) as e:
        flip_and_crop(**kwargs)
    assert message in str(e.value)


def test_augmented_runs_are_deterministic_and_differ_from_plain_ones(tmp_path):
    config = ExperimentConfig().replace(rounds=2, eval_every=2, local_steps=3, local_epochs=None,
                                        augment="flip_crop")
    first = run(config.replace(out_dir=str(tmp_path / "a")), progress=False)
    second = run(config.replace(out_dir=str(tmp_path / "b")), progress=False)
    plain = run(config.replace(out_dir=str(tmp_path / "c"), augment="none"), progress=False)
    assert first[-1]["loss"] == second[-1]["loss"]
    assert first[-1]["loss"] != plain[-1]["loss"]
