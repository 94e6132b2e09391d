"""Why bucketing collapses Krum under IID sign flip on MNIST-1D and not on Fashion-MNIST.

In `evidence_byzantine.json`'s IID sign-flip row, Krum + bucketing ends at 12.9 % on MNIST-1D
(36.8 points below Krum alone) and at 79.3 % on Fashion-MNIST (0.3 below Krum alone). The
explanation on the evidence page: every Byzantine row is b = -u_bar (the negated honest mean), so
a bucket of s = 2 that pairs an honest update u_i with b averages to (u_i - u_bar) / 2, half an
honest update's noise around zero. When the noise outweighs the mean, these buckets are tighter
than the honest ones, Krum (Blanchard et al., NeurIPS 2017: the row of least sum of squared
distances to its n - f - 2 nearest rows) picks one, and the server steps on noise.

This script measures the ratio along the row's own training, on both tasks: the sweep's setting
(25 IID clients, clients 1, 2, 3, 14, 20 Byzantine, each client one SGD step at local lr 1 on a
batch of 32, so it sends u_i = -grad_i; buckets of two in a random order; Krum with f = 5 on the
13 bucket means; the server steps by server_lr times Krum's choice, at the lr the sweep selected
for this cell: 0.8 on MNIST-1D, 0.4 on Fashion-MNIST), written here without the engine so that
each round can report

    rho_t = sqrt(1/h sum_{i in H} ||u_i - u_bar||^2) / ||u_bar||    (h = 20 honest clients)

and whether the bucket Krum picked holds a Byzantine row. Per quarter of the rounds it prints
the median rho and that pick rate; at the end, the test accuracy (a check that the simulation
lands where the sweep's cell did; its batches and initialization are its own, not the sweep's).

    python experiments/byzantine_bucketing_krum.py [--seeds 3] [--rounds 600] [--data-dir DIR]
"""
import argparse

import jax
from jax.flatten_util import ravel_pytree
import jax.numpy as jnp
import numpy as np

from fljax.data.idx import DEBIAN_FASHION_MNIST
from fljax.data.loaders import load_dataset, validation_split
from fljax.data.partition import iid
from fljax.models.model import cross_entropy
from fljax.models.zoo import make_model
from fljax.robustness import aggregators, attacks

BYZANTINE = (1, 2, 3, 14, 20)   # the byzantine wrapper's draw with its seed 24 (see the json)
TASKS = {"mnist1d": ("cnn1d", 0.8), "fashion_mnist": ("linear", 0.4)}   # model, selected lr
CLIENTS, F, BATCH, BUCKET = 25, 5, 32, 2


def krum_of_buckets(sent, key):
    """Bucketing (s = 2, order drawn from ``key``) then Krum (f = 5) on the bucket means, as the
    sweep's 'Krum + bucketing' column: returns Krum's bucket mean and the ids of the clients in
    that bucket (fljax.robustness.aggregators.bucketing's order, -1 elsewhere)."""
    mask = jnp.ones(CLIENTS, bool)
    buckets, bucket_mask = aggregators.bucketing(sent, mask, key, BUCKET)
    picked = jnp.argmin(aggregators.krum_scores(buckets, bucket_mask, F))
    order = jax.random.permutation(key, CLIENTS)            # bucketing's order: all rows are real
    return buckets[picked], jnp.where(jnp.arange(CLIENTS) // BUCKET == picked, order, -1)


def round_fn(model, server_lr):
    """One round: honest updates, sign-flipped Byzantine rows, bucketing, Krum, the server step.
    Returns the new parameters, rho_t and whether Krum's bucket holds a Byzantine row."""
    byzantine = np.isin(np.arange(CLIENTS), BYZANTINE)
    mask = jnp.ones(CLIENTS, bool)

    def update(params, x, y):
        grads = jax.grad(lambda p: cross_entropy(model.apply(p, x), y))(params)
        return jnp.concatenate([-g.ravel() for g in jax.tree.leaves(grads)])

    @jax.jit
    def step(params, x, y, key):
        rows = jax.vmap(update, in_axes=(None, 0, 0))(params, x, y)        # [25, d]
        honest = rows[~byzantine]
        mean = honest.mean(0)
        rho = jnp.sqrt(jnp.mean(jnp.sum((honest - mean) ** 2, 1))) / jnp.linalg.norm(mean)
        sent = attacks.sign_flip(rows, mask, byzantine)
        aggregate, members = krum_of_buckets(sent, key)
        flat, unravel = ravel_pytree(params)
        return (unravel(flat + server_lr * aggregate), rho,
                jnp.any(jnp.isin(members, np.array(BYZANTINE))))

    return step


def simulate(name, data, seed, rounds):
    model_name, server_lr = TASKS[name]
    kept, _ = validation_split(len(data.x_train), 0.1, seed)
    x_train, y_train = data.x_train[kept], data.y_train[kept]
    parts = iid(y_train, CLIENTS, seed=seed)
    model = make_model(model_name, data.x_train[0], data.num_classes)
    params = model.init(jax.random.PRNGKey(seed))
    step = round_fn(model, server_lr)
    rng = np.random.default_rng(seed)
    key = jax.random.PRNGKey(1000 + seed)
    rhos, picks = [], []
    for _ in range(rounds):
        idx = np.stack([rng.choice(part, BATCH, replace=False) for part in parts])
        key, sub = jax.random.split(key)
        params, rho, pick = step(params, x_train[idx], y_train[idx], sub)
        rhos.append(rho)            # device scalars: read back once, after the last round
        picks.append(pick)
    logits = model.apply(params, jnp.asarray(data.x_test))
    accuracy = float(jnp.mean(jnp.argmax(logits, -1) == data.y_test)) * 100
    return np.asarray(jnp.stack(rhos)), np.asarray(jnp.stack(picks)), accuracy


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=600)
    parser.add_argument("--data-dir", default=DEBIAN_FASHION_MNIST,
                        help="the Fashion-MNIST IDX files' folder")
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    args = parser.parse_args(argv)
    print("task | seed | quarter | median rho | Krum picks a Byzantine bucket")
    for name in args.tasks:
        data = load_dataset(name, data_dir=args.data_dir if name == "fashion_mnist" else None)
        for seed in range(args.seeds):
            rhos, picks, accuracy = simulate(name, data, seed, args.rounds)
            for q, (r, p) in enumerate(zip(np.array_split(rhos, 4), np.array_split(picks, 4))):
                print(f"{name} | {seed} | {q + 1} | {np.median(r):.2f} | {p.mean() * 100:.0f} %")
            print(f"{name} | {seed} | test accuracy after {args.rounds} rounds: {accuracy:.2f} %")


if __name__ == "__main__":
    main()
