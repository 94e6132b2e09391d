"""FedInit's noisy data: client-based and category-based biases added to images at split time.

FedInit (Sun, Shen and Tao, NeurIPS 2023) section 5 ("Setups"): "we change the strength of the RGB
channels with a random Gaussian noise for different clients" (client-based biases: the clients'
cameras differ) and "we add different brightness perturbations to the samples in each category by a
random Gaussian noise" (category-based biases), so that "the heterogeneity of the local dataset is
significantly enlarged". The paper gives neither noise's form nor its scale; fljax reads them as

    x'_{i,n}[..., c] = (1 + sigma_client * e_{i,c}) * (x_n[..., c] + sigma_class * b_{i,y_n})

with e_{i,c}, b_{i,k} ~ N(0, 1) drawn once per run from its seed: client i's channel c is scaled
by its own factor (its "camera"), and client i's images of class k are brightened by its own
offset b_{i,k} (``CLASS_NOISE_READINGS`` 'per_client', the default: the class term differs
between clients and touches only their training copies; validation and test images are clean).
The alternative reading 'shared' draws one offset b_k per class, the same for every client, and
adds it to the training, validation and test images alike: it makes clients no more different
and gives every image a label-correlated brightness (on digits it makes the task easier). Both act
on the images as the model sees them (standardized where the loader standardizes), so the sigmas
are in those units. A split with replacement lists an example under several clients: each client
gets its own copy.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from fljax.errors import FljaxError

CLASS_NOISE_READINGS = ("per_client", "shared")


def draws(num_clients: int, num_classes: int, channels: int, seed: int
          ) -> tuple[np.ndarray, np.ndarray]:
    """(e [num_clients, channels], b [num_classes]): the standard normal draws of a run."""
    rng = np.random.default_rng([seed, 0x6E6F697365])        # a stream of its own ("noise")
    return rng.standard_normal((num_clients, channels)), rng.standard_normal(num_classes)


def client_class_draws(num_clients: int, num_classes: int, seed: int) -> np.ndarray:
    """b [num_clients, num_classes]: the per-client class offsets' standard normal draws of a run
    (reading 'per_client'; a stream of its own, so e and the shared b are as without it)."""
    rng = np.random.default_rng([seed, 0x6E6F697365, 1])
    return rng.standard_normal((num_clients, num_classes))


def check_images(x, name: str, what: str) -> None:
    if not isinstance(x, np.ndarray) or x.ndim != 4:
        raise FljaxError(f"{what} needs images [N, H, W, C]; dataset {name!r} has inputs of "
                         f"shape {getattr(x, 'shape', type(x).__name__)}")


def brighten_classes(x: np.ndarray, y: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """x_n + o_{y_n} on every pixel and channel (``offsets`` = sigma_class * b)."""
    return (x + offsets[y].astype(x.dtype)[:, None, None, None]).astype(x.dtype)


def scale_clients(x: np.ndarray, y: np.ndarray, parts: Sequence[np.ndarray],
                  scales: np.ndarray, offsets: np.ndarray | None = None
                  ) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """(x', y', parts'): client i's examples copied as ``scales[i, c] * (x + offsets[i, y])`` on
    channel c (``offsets`` [clients, classes], default none), clients one after another (parts'
    are consecutive ranges)."""
    def copy(i, part):
        shifted = x[part] if offsets is None else brighten_classes(x[part], y[part], offsets[i])
        return shifted * scales[i].astype(x.dtype)
    copies = [copy(i, part) for i, part in enumerate(parts)]
    ends = np.cumsum([len(part) for part in parts])
    new_parts = [np.arange(end - len(part), end) for end, part in zip(ends, parts)]
    return (np.concatenate(copies).astype(x.dtype), np.concatenate([y[p] for p in parts]),
            new_parts)
