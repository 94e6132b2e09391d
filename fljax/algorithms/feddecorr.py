"""FedDecorr: FedAvg with a feature-decorrelation regularizer against dimensional collapse.

Shi, Liang, Li, Zheng, Li, Feng, Zhou, "Towards Understanding and Mitigating Dimensional Collapse
in Heterogeneous Federated Learning", ICLR 2023; official ``bytedance/FedDecorr``,
``loss.py:FedDecorrLoss``.

For the N x d penultimate features z of a batch (``model.apply_with_features``):

    z^  = (z - mean(z)) / sqrt(var(z) + 1e-8)       per feature; var unbiased (divides by N - 1)
    K   = z^T z^                                      d x d, about (N - 1) x the correlation matrix
    L_d = (1 / (d (d - 1))) sum_{j != k} K_jk^2 / N   (0 when N = 1, as in the code)
    L   = CE(logits, y) + beta * L_d

With a partial last batch (padded examples, mask 0), N is the number of VALID examples and the
mean, variance and K use only the valid rows: the batch is the one torch's DataLoader would yield
(``drop_last=False``). The server is FedAvg (weighted by n_i in the official code; any
``server_optimizer``).

Default beta = 0.1 (``--feddecorr_coef``; the scripts use 0.1 for CIFAR-10 and Tiny-ImageNet,
0.05 for CIFAR-100). Not copied: FedBug's copy with coefficient 0.001. beta = 0 is FedAvg exactly.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from fljax.algorithms.base import Algorithm, ClientContext, ClientOptimizer, LocalSGD, LossFn
from fljax.algorithms.fedavg import fedavg
from fljax.hyperparams import NON_NEGATIVE, check
from fljax.models.model import Model, cross_entropy


def decorrelation_loss(features: jax.Array, mask: jax.Array, eps: float = 1e-8) -> jax.Array:
    """FedDecorrLoss over the valid rows (``mask``) of ``features`` [N, d]; 0 if < 2 are valid."""
    width = features.shape[1]
    if width < 2:
        return jnp.zeros((), features.dtype)  # no off-diagonal entries
    mask = mask.astype(features.dtype)[:, None]
    count = mask.sum()
    mean = jnp.sum(mask * features, axis=0) / jnp.maximum(count, 1.0)
    centred = mask * (features - mean)
    var = jnp.sum(centred * centred, axis=0) / jnp.maximum(count - 1.0, 1.0)
    z = centred / jnp.sqrt(var + eps)
    k = z.T @ z
    off_diagonal = jnp.sum(jnp.where(jnp.eye(width, dtype=bool), 0.0, k * k))
    loss = off_diagonal / (width * (width - 1)) / jnp.maximum(count, 1.0)
    return jnp.where(count > 1, loss, 0.0)


def feddecorr(local: LocalSGD | optax.GradientTransformation | ClientOptimizer, model: Model, *,
              beta: float = 0.1, server_optimizer: optax.GradientTransformation | None = None
              ) -> Algorithm:
    """FedAvg whose clients add beta x the decorrelation loss of ``model``'s features."""
    check("beta", beta, NON_NEGATIVE, "a finite number >= 0")

    def client_loss(ctx: ClientContext, loss_fn: LossFn) -> LossFn:
        del ctx, loss_fn  # replaced: CE and the regularizer share one forward pass

        def loss(params, x, y, mask, rng):
            features, logits = model.apply_with_features(params, x, train=True, rng=rng)
            return cross_entropy(logits, y, mask) + beta * decorrelation_loss(features, mask)

        return loss

    return fedavg(local, server_optimizer, name="feddecorr")._replace(client_loss=client_loss)
