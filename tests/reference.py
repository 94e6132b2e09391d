"""Float64 numpy references written straight from the papers' equations.

The randomness (which clients, which examples in which local step) is taken from fljax's own pure
sampling functions; every piece of arithmetic is recomputed here in float64 numpy, client after
client and step after step, with hand-written gradients of a one-hidden-layer ReLU network.
"""

from __future__ import annotations

import jax
import numpy as np

from fljax.data.batching import client_batch, steps_per_epoch
from fljax.core.engine import bernoulli_cohort, client_keys, round_key, sample_cohort


def mlp_loss_and_grad(params, x, y, mask):
    """Mean cross-entropy over masked examples of relu(x W1 + b1) W2 + b2, and its gradient."""
    w1, b1 = params["fc1"]["kernel"], params["fc1"]["bias"]
    w2, b2 = params["fc2"]["kernel"], params["fc2"]["bias"]
    x = x.reshape(len(x), -1)
    pre = x @ w1 + b1
    h = np.maximum(pre, 0.0)
    logits = h @ w2 + b2
    logits = logits - logits.max(axis=1, keepdims=True)
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    weight = mask / max(mask.sum(), 1.0)
    loss = -np.sum(weight * np.log(probs[np.arange(len(y)), y]))
    dlogits = probs.copy()
    dlogits[np.arange(len(y)), y] -= 1.0
    dlogits *= weight[:, None]
    dh = dlogits @ w2.T * (pre > 0)
    grads = {"fc1": {"kernel": x.T @ dh, "bias": dh.sum(0)},
             "fc2": {"kernel": h.T @ dlogits, "bias": dlogits.sum(0)}}
    return loss, grads


def tree_map(fn, *trees):
    return jax.tree.map(fn, *trees)


def local_sgd(w, steps, part, x, y, lr):
    """Plain local SGD (float64) from ``w``: one step per (positions, mask) of ``steps`` on the
    client's examples ``part`` (positions past its count clipped to its last example)."""
    local = tree_map(np.copy, w)
    for positions, mask in steps:
        examples = part[np.minimum(np.asarray(positions), len(part) - 1)]
        _, g = mlp_loss_and_grad(local, x[examples], y[examples], np.asarray(mask, np.float64))
        local = tree_map(lambda a, b: a - lr * b, local, g)
    return local


def cohort_full_gradients(w, x, y, parts, client_ids):
    """Each client's full-batch gradient g_i(w) and their example-weighted mean
    gbar = sum_S n_i g_i(w) / sum_S n_i (FedGA's and the GradientAlignment code's first exchange)."""
    grads = {cid: mlp_loss_and_grad(w, x[parts[cid]], y[parts[cid]],
                                    np.ones(len(parts[cid])))[1] for cid in client_ids}
    n = {cid: float(len(parts[cid])) for cid in grads}
    gbar = tree_map(lambda *g: sum(n[c] * gi for c, gi in zip(grads, g)) / sum(n.values()),
                    *grads.values())
    return grads, gbar


def user_summaries(acc, loss, users) -> dict:
    """The personalized evaluator's per-group summaries of per-user test accuracies and losses:
    mean, bottom ten percentile, std over users, example-weighted mean accuracy, mean loss."""
    acc, loss = np.array(acc), np.array(loss)
    counts = np.array([len(t) for t in users.test], np.float64)
    scores = {}
    for group, ids in (("existing", users.existing), ("new", users.new)):
        scores.update({f"{group}_test_acc": np.mean(acc[ids]),
                       f"{group}_test_acc_p10": np.percentile(acc[ids], 10),
                       f"{group}_test_acc_std": np.std(acc[ids]),
                       f"{group}_test_acc_weighted": np.sum(acc[ids] * counts[ids])
                       / counts[ids].sum(),
                       f"{group}_test_loss": np.mean(loss[ids])})
    return scores


def global_norm(tree) -> float:
    return float(np.sqrt(sum(np.sum(leaf ** 2) for leaf in jax.tree.leaves(tree))))


def sgd_buffer(g, local, buf, *, momentum, weight_decay, clip):
    """torch SGD's step direction after clip_grad_norm_: d = clip(g) + weight_decay * y;
    buf = d on the first step, else momentum * buf + d (the step is y -= lr * buf)."""
    if clip is not None:
        norm = global_norm(g)
        g = tree_map(lambda a: a * clip / max(norm, clip), g)
    g = tree_map(lambda a, b: a + weight_decay * b, g, local)
    return g if buf is None else tree_map(lambda m, a: momentum * m + a, buf, g)


def client_schedule(key, round_index, client_ids_count, counts, batch_size, local_steps,
                    local_epochs, max_count, participation="uniform"):
    """Yield, per sampled client, (client id, list of (positions, mask)) exactly as sampled;
    with Bernoulli participation, the clients who joined (rate client_ids_count / N)."""
    sample_key, client_key = round_key(key, round_index)
    if participation == "bernoulli":
        ids, joined = bernoulli_cohort(sample_key, len(counts), client_ids_count / len(counts))
        cohort = np.sort(np.asarray(ids)[np.asarray(joined)])
    else:
        cohort = np.asarray(sample_cohort(sample_key, len(counts), client_ids_count))
    for cid in cohort:
        n = int(counts[cid])
        num_steps = local_steps if local_steps is not None else local_epochs * int(
            steps_per_epoch(n, batch_size))
        _, batch_key, _ = client_keys(client_key, cid)
        steps = []
        for k in range(num_steps):
            pos, mask = client_batch(batch_key, n, k, batch_size, max_count)
            steps.append((np.asarray(pos), np.asarray(mask, np.float64)))
        yield int(cid), steps
