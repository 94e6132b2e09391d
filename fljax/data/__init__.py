"""Federated data: loaders, partitioners, on-device client layout and per-step batches."""

from fljax.data.augment import flip_and_crop
from fljax.data.batching import (batch_from_order, client_batch, epoch_order, epoch_order_at,
                                 steps_per_epoch)
from fljax.data.dataset import Dataset
from fljax.data.federated import FederatedData, federate, with_parts
from fljax.data.loaders import (load_dataset, load_digits, load_mnist1d, load_tfds,
                                normalize_channels)
from fljax.data.partition import (classes_per_client, dirichlet, dirichlet_balanced, iid,
                                  label_skew, natural)
from fljax.data.synthetic import load_synthetic
from fljax.data.users import Users, split_users

__all__ = ["Dataset", "FederatedData", "Users", "batch_from_order", "classes_per_client",
           "client_batch", "dirichlet", "dirichlet_balanced", "epoch_order", "epoch_order_at",
           "federate", "flip_and_crop", "iid", "label_skew", "load_dataset", "load_digits",
           "load_mnist1d", "load_synthetic", "load_tfds", "natural", "normalize_channels", "split_users",
           "steps_per_epoch", "with_parts"]
