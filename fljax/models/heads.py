"""MOON's projection head: a classifier on top of a projection of the base model's features.

Li, He, Song, "Model-Contrastive Federated Learning", CVPR 2021; official ``QinbinLi/MOON``,
``model.py:ModelFedCon``:

    h = backbone(x)                 the base model's penultimate features (its classifier dropped)
    z = l2(ReLU(l1(h)))             l1: d -> d, l2: d -> out_dim          (the projection)
    y = l3(z)                       l3: out_dim -> num_classes           (the new classifier)

``apply_with_features`` returns ``(z, y)``: MOON contrasts the projections z. The classifier sits
ON TOP of the projection, as in the official code (not beside it, as in SimCLR).

The base model's last top-level group must be its classifier (a Dense layer features -> logits,
as every model of ``fljax.models.zoo`` has): it is dropped from the parameters, so the head model
has exactly the official parameter count (e.g. the MOON simple-cnn with ``out_dim=256`` on CIFAR-10:
92,626). Its groups are the base's groups without the classifier, then ``l1, l2, l3``.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from fljax.errors import FljaxError
from fljax.models.layers import dense
from fljax.models.model import Model

HEAD_GROUPS = ("l1", "l2", "l3")


class ProjectionHead(nn.Module):
    """z = l2(relu(l1(h))), logits = l3(z); Linear layers with PyTorch's default init."""

    hidden: int
    out_dim: int
    num_classes: int

    @nn.compact
    def __call__(self, h):
        hidden = nn.relu(dense(self.hidden, self.hidden, "l1")(h))
        z = dense(self.out_dim, self.hidden, "l2")(hidden)
        return z, dense(self.num_classes, self.out_dim, "l3")(z)


def with_projection_head(model: Model, out_dim: int = 256) -> Model:
    """``model``'s backbone with MOON's projection head (l1, l2) and a classifier l3 on top."""
    if not (isinstance(out_dim, int) and out_dim >= 1):
        raise FljaxError(f"out_dim must be an integer >= 1, got {out_dim!r}")
    base_params = jax.eval_shape(model.init, jax.random.key(0))
    classifier = model.groups[-1]
    clash = sorted(set(HEAD_GROUPS) & set(model.groups))
    if clash:
        raise FljaxError(f"the base model {model.name!r} already has parameter groups {clash}; "
                         f"the projection head adds {list(HEAD_GROUPS)}")
    features, _ = jax.eval_shape(
        lambda p: model.apply_with_features(p, model.dummy_input()),
        base_params)
    if features.ndim != 2:
        raise FljaxError(f"the base model's features must have shape [batch, d], got "
                         f"{features.shape}")
    width = features.shape[1]
    kernel = getattr(base_params[classifier], "get", lambda k: None)("kernel")
    if kernel is None or kernel.shape != (width, model.num_classes):
        raise FljaxError(f"the base model's last parameter group {classifier!r} must be its "
                         f"classifier, a Dense layer of kernel shape {(width, model.num_classes)}")
    head = ProjectionHead(width, out_dim, model.num_classes)

    def init(key):
        base_key, head_key = jax.random.split(key)
        params = dict(model.init(base_key))
        del params[classifier]
        params.update(head.init(head_key, jnp.zeros((1, width), jnp.float32))["params"])
        return params

    def apply_with_features(params, x, train=False, rng=None):
        backbone = {k: v for k, v in params.items() if k not in HEAD_GROUPS}
        # The base's classifier is not a parameter of this model: zeros stand in for it, and the
        # base's logits are unused (XLA removes their computation).
        backbone[classifier] = jax.tree.map(
            lambda s: jnp.zeros(s.shape, jax.tree.leaves(params)[0].dtype), base_params[classifier])
        h, _ = model.apply_with_features(backbone, x, train=train, rng=rng)
        return head.apply({"params": {k: params[k] for k in HEAD_GROUPS}}, h)

    def apply(params, x, train=False, rng=None, mask=None):
        del mask    # the base's features take no example mask (MOON's bases have no BatchNorm)
        return apply_with_features(params, x, train, rng)[1]

    groups = tuple(g for g in model.groups if g != classifier) + HEAD_GROUPS
    return Model(f"{model.name}+proj{out_dim}", init, apply, apply_with_features, groups,
                 model.input_spec, model.num_classes)
