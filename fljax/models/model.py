"""A model as fljax uses it: pure functions of explicit parameters, plus its layer order."""

from __future__ import annotations

import inspect
from typing import Any, Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax.traverse_util import flatten_dict, unflatten_dict

from fljax.errors import FljaxError

Params = Any


class Model(NamedTuple):
    """Pure functions around a Flax module.

    ``apply(params, x, train=False, rng=None, mask=None) -> logits`` and
    ``apply_with_features(params, x, train=False, rng=None) -> (features, logits)``, where features
    are the penultimate representation (MOON, FedDecorr, feature analysis). ``groups`` names the
    top-level parameter groups in order from input to output (FedBug unfreezes them bottom-up).
    ``input_spec`` is one example's shape and dtype (a ``jax.ShapeDtypeStruct``, or a dict of them
    for structured inputs such as a graph); ``input_shape`` is its shape for array inputs.

    A model with state (BatchNorm running statistics, any Flax collection besides ``params``)
    keeps it in the same tree as its parameters, next to them in their module's dict, so every
    algorithm, checkpoint and probe handles one tree. ``state_mask`` is True on those leaves (None
    for a stateless model); ``update_state(params, x, rng=None, mask=None)`` returns the tree after
    one training forward pass on ``x`` (new statistics, same parameters). Local training never lets
    the optimizer move a state leaf and sets it from ``update_state`` instead
    (``fljax.core.clients.local_training``), as torch's buffers are updated by the forward pass.
    """

    name: str
    init: Callable[[jax.Array], Params]
    apply: Callable[..., jax.Array]
    apply_with_features: Callable[..., tuple[jax.Array, jax.Array]]
    groups: tuple[str, ...]
    input_spec: Any
    num_classes: int
    state_mask: Params | None = None
    update_state: Callable[..., Params] | None = None
    component: "Model | None" = None   # a mixture's component model (fljax.models.mixture)

    @property
    def input_shape(self) -> tuple[int, ...]:
        """One example's shape (array inputs only)."""
        if not isinstance(self.input_spec, jax.ShapeDtypeStruct):
            raise FljaxError(f"model {self.name!r} takes structured inputs "
                             f"{jax.tree.map(lambda s: s.shape, self.input_spec)}, not one array")
        return tuple(self.input_spec.shape)

    def dummy_input(self, batch: int = 1):
        """Zeros shaped like a batch of ``batch`` examples."""
        return jax.tree.map(lambda s: jnp.zeros((batch, *s.shape), s.dtype), self.input_spec)


def input_spec_of(example) -> Any:
    """One example's ``jax.ShapeDtypeStruct`` (tree): a shape tuple means float32 inputs; arrays
    or ShapeDtypeStructs (one example, no batch axis) keep their shapes and dtypes."""
    if isinstance(example, (tuple, list)) and all(isinstance(d, int) for d in example):
        return jax.ShapeDtypeStruct(tuple(example), jnp.float32)
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(tuple(a.shape), a.dtype), example)


def cast_inputs(x, params: Params):
    """Floating inputs in the parameters' dtype; integer inputs (tokens, node ids) unchanged."""
    dtype = jax.tree.leaves(params)[0].dtype
    if not jnp.issubdtype(dtype, jnp.floating):
        return x
    return jax.tree.map(lambda a: a.astype(dtype) if jnp.issubdtype(a.dtype, jnp.floating)
                        else a, x)


def merge_collections(variables: dict) -> tuple[Params, dict[tuple, str]]:
    """Flax variables {'params': P, 'batch_stats': S, ...} as one tree: each state leaf sits in
    its module's dict next to the module's parameters. Returns (tree, {state leaf path:
    collection})."""
    flat = dict(flatten_dict(variables["params"]))
    collection_of = {}
    for collection, tree in variables.items():
        if collection == "params":
            continue
        for path, leaf in flatten_dict(tree).items():
            if path in flat:
                raise FljaxError(f"model state {collection}/{'/'.join(path)} has the name of a "
                                 f"parameter; rename one of them")
            flat[path] = leaf
            collection_of[path] = collection
    return unflatten_dict(flat), collection_of


def split_collections(tree: Params, collection_of: dict[tuple, str]) -> dict:
    """The inverse of ``merge_collections``: Flax variables from one tree."""
    variables = {"params": {}, **{c: {} for c in collection_of.values()}}
    for path, leaf in flatten_dict(tree).items():
        variables[collection_of.get(path, "params")][path] = leaf
    return {c: unflatten_dict(flat) for c, flat in variables.items()}


def from_module(name: str, module: nn.Module, input_spec, num_classes: int | None = None) -> Model:
    """Wrap any Flax module whose ``__call__(x, ...)`` returns logits as a Model.

    ``input_spec``: one example's shape (float32 inputs, e.g. ``(28, 28, 1)``), or an example
    array / ShapeDtypeStruct (int32 tokens ``[T]``), or a dict of them (a graph). Optional keyword
    arguments of ``__call__`` are used when the module has them:

    - ``train: bool`` (or ``deterministic: bool``, its negation): training mode, e.g. dropout on,
      BatchNorm on batch statistics; dropout draws from the ``'dropout'`` rng stream;
    - ``with_features: bool``: return ``(features, logits)``, the penultimate representation
      that MOON, FedDecorr and the feature probes need. A module without it still trains with
      every other algorithm; ``apply_with_features`` then raises a clear error;
    - ``mask``: which examples of a padded batch are real (e.g. BatchNorm's batch statistics
      over the real ones only, as torch computes them on a smaller last batch).

    Floating inputs are cast to the dtype of the parameters, so a float64 model (e.g. built with
    ``param_dtype=jnp.float64`` under ``jax_enable_x64``) computes in float64 and a float32 model in
    float32 whatever the data's dtype; integer inputs stay integers. ``num_classes`` defaults to
    the width of the logits. Collections besides ``params`` (BatchNorm's ``batch_stats``) become
    the model's state (see Model).
    """
    accepted = inspect.signature(module.__call__).parameters
    has_features = "with_features" in accepted
    spec = input_spec_of(input_spec)
    dummy = lambda: jax.tree.map(lambda s: jnp.zeros((1, *s.shape), s.dtype), spec)
    variables_shape = jax.eval_shape(lambda k: module.init(k, dummy()), jax.random.key(0))
    _, collection_of = merge_collections(variables_shape)
    stateful = bool(collection_of)
    mutable = sorted(set(collection_of.values()))

    def init(key):
        return merge_collections(module.init(key, dummy()))[0]

    def call(params, x, train, rng, with_features, mask=None, keep_state=False):
        kwargs = {}
        if "train" in accepted:
            kwargs["train"] = train
        elif "deterministic" in accepted:
            kwargs["deterministic"] = not train
        if with_features:
            kwargs["with_features"] = True
        if mask is not None and "mask" in accepted:
            kwargs["mask"] = mask
        rngs = {"dropout": rng} if rng is not None else {}
        variables = split_collections(params, collection_of) if stateful else {"params": params}
        x = cast_inputs(x, params)
        if stateful and train:
            out, state = module.apply(variables, x, rngs=rngs, mutable=mutable, **kwargs)
            if keep_state:
                return merge_collections({**variables, **state})[0]
            return out
        return module.apply(variables, x, rngs=rngs, **kwargs)

    def apply_with_features(params, x, train=False, rng=None):
        if not has_features:
            raise FljaxError(f"model {name!r} does not return features: give its __call__ a "
                             f"'with_features' argument that makes it return (features, logits)")
        return call(params, x, train, rng, with_features=True)

    def apply(params, x, train=False, rng=None, mask=None):
        return call(params, x, train, rng, with_features=False, mask=mask)

    def update_state(params, x, rng=None, mask=None):
        return call(params, x, True, rng, with_features=False, mask=mask, keep_state=True)

    groups: list[str] = []

    def record_groups(key):  # the traced dict keeps creation order; eval_shape's result is sorted
        params = init(key)
        groups.extend(params)
        return params

    abstract = jax.eval_shape(record_groups, jax.random.key(0))
    if num_classes is None:
        num_classes = int(jax.eval_shape(apply, abstract, dummy()).shape[-1])
    state_mask = None
    if stateful:
        state_mask = unflatten_dict({path: path in collection_of
                                     for path in flatten_dict(abstract)})
    return Model(name, init, apply, apply_with_features, tuple(groups), spec, num_classes,
                 state_mask, update_state if stateful else None)


def label_weights(labels: jax.Array, mask: jax.Array | None, dtype) -> jax.Array:
    """1 where a label is scored: its example is real (``mask``, one per example) and the label
    is >= 0 (-1 marks positions without a target: padding, unlabeled graph nodes)."""
    weights = (labels >= 0).astype(dtype)
    if mask is not None:
        weights = weights * mask.astype(dtype).reshape(mask.shape + (1,) * (labels.ndim - 1))
    return weights


def cross_entropy(logits: jax.Array, labels: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """Mean softmax cross-entropy over the scored labels (``label_weights``).

    labels: [B] (one class per example) or [B, ...] (one per position: next-character targets
    [B, T], node labels [B, V]) with logits [..., C]; mask: [B] or None (every example)."""
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.maximum(labels, 0))
    weights = label_weights(labels, mask, losses.dtype)
    return (losses * weights).sum() / jnp.maximum(weights.sum(), 1.0)


def num_params(params: Params) -> int:
    """Total number of scalars in a parameter tree."""
    return sum(int(p.size) for p in jax.tree.leaves(params))
