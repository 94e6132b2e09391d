"""Federated data: loaders, partitioners, on-device client layout and per-step batches."""

from fljax.data.batching import (batch_from_order, client_batch, epoch_order, epoch_order_at,
                                 steps_per_epoch)
from fljax.data.federated import FederatedData, federate
from fljax.data.loaders import Dataset, load_dataset, load_digits, load_tfds, normalize_channels
from fljax.data.partition import (classes_per_client, dirichlet, dirichlet_balanced, iid,
                                  label_skew)

__all__ = ["Dataset", "FederatedData", "batch_from_order", "classes_per_client", "client_batch",
           "dirichlet", "dirichlet_balanced", "epoch_order", "epoch_order_at", "federate", "iid", "label_skew", "load_dataset",
           "load_digits", "load_tfds", "normalize_channels", "steps_per_epoch"]
