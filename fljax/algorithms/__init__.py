"""Federated algorithms: NamedTuples of pure functions built by factories."""

from fljax.algorithms.base import (Algorithm, ClientContext, ClientOptimizer, LocalSGD,
                                   as_client_optimizer,
                                   identity_loss, identity_start, local_sgd, no_client_state,
                                   tree_scale, tree_sub)
from fljax.algorithms.fedavg import fedavg, fedsgd

__all__ = ["Algorithm", "ClientContext", "ClientOptimizer", "LocalSGD", "as_client_optimizer", "fedavg",
           "fedsgd", "identity_loss", "identity_start", "local_sgd", "no_client_state",
           "tree_scale", "tree_sub"]
