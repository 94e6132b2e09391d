"""Graph neural networks on padded subgraphs (``fljax.data.graphs``), message passing written with
``jax.ops.segment_sum``."""

from __future__ import annotations

import flax.linen as nn
import jax

from fljax.models.layers import BatchNorm, dense, dropout


def neighbour_sum(h: jax.Array, senders: jax.Array, receivers: jax.Array,
                  edge_mask: jax.Array) -> jax.Array:
    """sum_{j -> i} h_j for every node i of each graph: h [B, V, D], edges [B, E] (masked edges
    add nothing)."""
    def one(h, s, r, m):
        return jax.ops.segment_sum(h[s] * m[:, None], r, num_segments=h.shape[0])

    return jax.vmap(one)(h, senders, receivers, edge_mask)


class GIN(nn.Module):
    """FederatedScope's ``GIN_Net`` (FedDecay's PubMed model; Xu et al. 2019): ``layers`` GIN
    convolutions h' = MLP((1 + eps) h + sum_{j -> i} h_j) with eps = 0 (PyG's GINConv default),
    each MLP Linear -> BatchNorm -> ReLU -> Linear (to ``hidden``, the last to the classes), and
    ReLU(dropout(h)) between convolutions. Per-node logits [B, V, classes]; BatchNorm's statistics
    are over the real nodes (``node_mask`` and the example mask) and are model state."""

    num_classes: int
    hidden: int = 64
    layers: int = 2
    dropout: float = 0.5

    @nn.compact
    def __call__(self, x: dict, train: bool = False, mask=None):
        h = x["nodes"]
        nodes = x["node_mask"] if mask is None else x["node_mask"] * mask[:, None]
        for i in range(self.layers):
            last = i == self.layers - 1
            h = h + neighbour_sum(h, x["senders"], x["receivers"], x["edge_mask"])
            h = dense(self.hidden, h.shape[-1], f"conv{i + 1}_fc1")(h)
            h = nn.relu(BatchNorm(name=f"conv{i + 1}_bn")(h, train, nodes))
            h = dense(self.num_classes if last else self.hidden, self.hidden,
                      f"conv{i + 1}_fc2")(h)
            if not last:
                h = nn.relu(dropout(self, train)(h))
        return h
