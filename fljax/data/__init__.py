"""Federated data: loaders, partitioners, on-device client layout and per-step batches."""

from fljax.data.batching import client_batch, epoch_order, steps_per_epoch
from fljax.data.federated import FederatedData, federate
from fljax.data.loaders import Dataset, load_dataset, load_digits, load_tfds, normalize_channels
from fljax.data.partition import (classes_per_client, dirichlet, dirichlet_balanced, iid,
                                  label_skew)

__all__ = ["Dataset", "FederatedData", "classes_per_client", "client_batch", "dirichlet",
           "dirichlet_balanced", "epoch_order", "federate", "iid", "label_skew", "load_dataset",
           "load_digits", "load_tfds", "normalize_channels", "steps_per_epoch"]
