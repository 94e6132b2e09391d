"""Personalized evaluation (FedDecay (Anonymous, 2023) section 4, after pFL-Bench): every user
fine-tunes the global model on its own training split, then is scored on its own validation and test
splits.

User u starts from the global model w and takes S steps of the fine-tuning optimizer (by default
SGD at the fine-tuning learning rate with the experiment's clip, momentum and weight decay;
FedDecay's trainer fine-tunes with beta = 1, no decay) on minibatches of its training split, read
in shuffled epochs like a round's local steps (``fljax.data.batching``):

    w_u,0 = w,      w_u,s+1 = w_u,s - eta_ft clip(grad f_u(w_u,s; batch s)),      s < S,

and acc_u = the accuracy of w_u,S on u's examples of a split; S = 0 scores w itself. Per group of
users (``existing``: they train in the federation; ``new``: held out) and split the summary is
the paper's: Acc = the mean over users (unweighted), the bottom ten percentile
``np.percentile(acc, 10)`` and sigma = the standard deviation over users (``np.std``), plus the
example-weighted mean. pFL-Bench's FEMNIST setting: S = 5, eta_ft = 0.01, clip 5, batch 32.
All users are fine-tuned in one compiled program (a ``lax.map`` over users); only the fine-tuned
models' correct counts and losses leave it. Algorithms with personal models (Ditto, pFedMe,
FedEM, FedBN) start each user's fine-tuning from its own model instead of w (see
``make_user_evaluator``); their per-client state (N x params for Ditto and pFedMe) stays on the
device, gathered one user at a time inside the program.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fljax.data.federated import FederatedData, take, with_parts
from fljax.data.users import Users
from fljax.core.clients import full_gradient, local_training, model_loss
from fljax.models.evaluate import batch_scores
from fljax.models.model import Model, Params

FINETUNE_STREAM = 0x7E5  # folded into a round's key: fine-tuning never reuses a training draw


def finetune_key(root_key: jax.Array, round_index: int) -> jax.Array:
    """The fine-tuning key of an evaluation after round ``round_index`` (resume-stable)."""
    return jax.random.fold_in(jax.random.fold_in(root_key, round_index), FINETUNE_STREAM)


def make_user_evaluator(model: Model, data: FederatedData, users: Users, *,
                        finetune: optax.GradientTransformation, steps: int,
                        batch_size: int | None, eval_batch: int = 256,
                        personal_model: Callable | None = None, fresh_state: Any = None,
                        adapt: Callable | None = None,
                        programs: dict | None = None) -> Callable[..., dict[str, float]]:
    """``evaluate(params, key, server_state=None, client_states=None) -> {'existing_test_acc',
    'existing_test_acc_p10', ...}``.

    ``data`` holds the examples (its own client layout is ignored); ``users`` says whose they
    are. ``batch_size=None`` fine-tunes on a user's whole training split at once.

    ``programs``: a dict shared by the evaluators of runs with the same ``model`` and fine-tuning
    optimizer (a batch of runs, ``fljax.runner.experiment.build_batch``). Without personal models
    and ``adapt`` the compiled per-user program depends on them and on the users' shapes only (the
    users' examples are its arguments), so those runs share one program per shape instead of
    compiling and loading one each (hundreds of runs in one batch otherwise exhaust the CPU
    compiler's code memory).

    Personal models (``Algorithm.personal_model(params, server_state, client_state)``): existing
    user ``users.existing[j]`` starts from the personal model of client row j of
    ``client_states`` (the round state's, stacked over the existing users), a new user from that
    of ``fresh_state`` (the state a client holds before it ever trains: ``client_init`` of the
    initial model); then ``adapt(model, gradient)`` if given (``Algorithm.adapt``, with the
    gradient of the user's mean loss on its training split: FedEM's E-step) and the S fine-tuning
    steps as above. Without ``personal_model`` every user starts from ``params``.
    """
    train = with_parts(data, users.train)
    splits = {"test": with_parts(data, users.test)}
    if all(len(v) for v in users.val):
        splits["val"] = with_parts(data, users.val)
    max_train = int(np.max(np.asarray(train.count)))
    batch = max_train if batch_size is None else batch_size
    groups = {"existing": users.existing, "new": users.new}
    groups = {name: ids for name, ids in groups.items() if len(ids)}

    loss_fn = model_loss(model)

    def fine_tuned(params, key, train: FederatedData, user):
        """The round's local loop (``engine.local_training``), S steps of ``finetune``."""
        batch_key, step_key = jax.random.split(jax.random.fold_in(key, user))
        local, _ = local_training(loss_fn, finetune, params, train, user, batch_key, step_key,
                                  num_steps=steps, max_steps=steps, batch=batch,
                                  max_count=max_train, model=model)
        return local

    largest = {name: int(np.max(np.asarray(split.count))) for name, split in splits.items()}

    def scored(params, split: FederatedData, most: int, user):
        """(correct, summed loss, scored labels) of ``params`` on ``user``'s examples of
        ``split``, whose users hold at most ``most`` examples each."""
        count, offset = split.count[user], split.offset[user]
        size = min(eval_batch, most)
        chunks = -(-most // size)

        def body(totals, c):
            slots = c * size + jnp.arange(size)
            mask = slots < count
            ids = split.index[offset + jnp.minimum(slots, count - 1)]
            scores = batch_scores(model, params, take(split.x, ids), split.y[ids], mask)
            return jax.tree.map(jnp.add, totals, scores), None

        zero = jnp.zeros((), jax.tree.leaves(params)[0].dtype)
        totals, _ = jax.lax.scan(body, (zero, zero, zero), jnp.arange(chunks))
        return totals

    num_users = len(users.train)
    rows = np.full(num_users, -1, np.int32)             # a new user has no row: -1
    rows[users.existing] = np.arange(len(users.existing))

    def start_of(params, personal, user):
        """The model user ``user`` fine-tunes: its personal model, or the global one."""
        if personal is None:
            return params
        server_state, states, fresh = personal
        row = jnp.asarray(rows)[user]
        own = jax.tree.map(lambda a, f: jnp.where(row >= 0, a[jnp.maximum(row, 0)], f),
                           states, fresh)               # no copy of the N x params states
        return personal_model(params, server_state, own)

    shape = (steps, batch, max_train, tuple(sorted(largest.items())), num_users, eval_batch)
    shareable = programs is not None and personal_model is None and adapt is None

    def per_user(params, key, train, splits, personal):   # data are arguments, not constants
        def one(user):
            start = start_of(params, personal, user)
            if adapt is not None:
                start = adapt(start, lambda at: full_gradient(
                    loss_fn, train, train.count[user], train.offset[user], at, batch, max_train))
            local = fine_tuned(start, key, train, user) if steps else start
            return {name: scored(local, split, largest[name], user)
                    for name, split in splits.items()}

        return jax.lax.map(one, jnp.arange(num_users))

    per_user = (programs.setdefault(shape, jax.jit(per_user)) if shareable
                else jax.jit(per_user))

    def evaluate(params: Params, key: jax.Array, server_state: Any = None,
                 client_states: Any = None) -> dict[str, float]:
        personal = None
        if personal_model is not None:
            if client_states is None:
                raise ValueError("this evaluator scores personal models: give client_states")
            personal = (server_state, client_states, fresh_state)
        results = jax.device_get(per_user(params, key, train, splits, personal))
        scores = {}
        for split_name, (correct, loss, scored) in results.items():
            count = np.asarray(scored, np.float64)
            for group, ids in groups.items():
                acc = np.asarray(correct, np.float64)[ids] / count[ids]
                prefix = f"{group}_{split_name}"
                scores.update({
                    f"{prefix}_acc": float(np.mean(acc)),
                    f"{prefix}_acc_p10": float(np.percentile(acc, 10)),
                    f"{prefix}_acc_std": float(np.std(acc)),
                    f"{prefix}_acc_weighted": float(np.sum(acc * count[ids]) / count[ids].sum()),
                    f"{prefix}_loss": float(np.mean(np.asarray(loss, np.float64)[ids]
                                                    / count[ids])),
                })
        return scores

    evaluate.program = per_user      # the compiled per-user program (shared where ``programs``)
    return evaluate
