"""Training-batch augmentation inside the compiled round (``make_round(augment=...)``).

The FedDyn code's CIFAR recipe (``utils_dataset.py:Dataset.__getitem__``; FedBug and FL-Simulator,
FedInit's code, copy it): the data are normalized once in advance, then every training example,
independently,

    with probability 1/2 is flipped horizontally, and then,
    with probability 1/2 is zero-padded by 4 pixels on each side (zeros in normalized space) and
    cropped back to H x W at a uniformly random offset in {0, ..., 8}^2.

Test images are never augmented. ``crop_probability=1`` is torchvision's per-example
``RandomCrop(32, padding=4)`` after ``RandomHorizontalFlip``. ``flip`` (``crop_probability=0``) is
FedBug's Tiny-ImageNet recipe: "horizontal flipping ... on all datasets, while adding cropping
augmentation on CIFAR-10 and CIFAR-100".
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from fljax.errors import FljaxError

AUGMENTATIONS = ("none", "flip_crop", "flip")
Augment = Callable[[jax.Array, jax.Array], jax.Array]


def flip_and_crop(pad: int = 4, flip_probability: float = 0.5,
                  crop_probability: float = 0.5) -> Augment:
    """``augment(key, x)`` for a batch ``x`` of shape [B, H, W, C], as the module doc says."""
    for name, p in (("flip_probability", flip_probability),
                    ("crop_probability", crop_probability)):
        if not 0.0 <= p <= 1.0:
            raise FljaxError(f"{name} must be in [0, 1], got {p!r}")
    if not isinstance(pad, int) or pad < 0:
        raise FljaxError(f"pad must be an integer >= 0, got {pad!r}")

    def augment(key: jax.Array, x: jax.Array) -> jax.Array:
        if x.ndim != 4:
            raise FljaxError(f"augmentation flip_crop works on images [B, H, W, C], got batches "
                             f"of shape {tuple(x.shape)}")
        n, h, w, c = x.shape
        flip_key, crop_key, offset_key = jax.random.split(key, 3)
        flip = jax.random.bernoulli(flip_key, flip_probability, (n, 1, 1, 1))
        x = jnp.where(flip, x[:, :, ::-1, :], x)
        if crop_probability == 0:
            return x
        padded = jnp.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
        offsets = jax.random.randint(offset_key, (n, 2), 0, 2 * pad + 1)
        window = lambda image, at: jax.lax.dynamic_slice(image, (at[0], at[1], 0), (h, w, c))
        cropped = jax.vmap(window)(padded, offsets)
        crop = jax.random.bernoulli(crop_key, crop_probability, (n, 1, 1, 1))
        return jnp.where(crop, cropped, x)

    return augment


def named_augmentation(name: str) -> Augment | None:
    """The augmentation a config names: 'none' (None), 'flip_crop' (the FedDyn-code recipe) or
    'flip' (flips only)."""
    if name not in AUGMENTATIONS:
        raise FljaxError(f"augment must be one of {AUGMENTATIONS}, got {name!r}")
    return {"flip_crop": flip_and_crop(), "flip": flip_and_crop(crop_probability=0.0)}.get(name)
