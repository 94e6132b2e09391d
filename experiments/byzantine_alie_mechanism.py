"""Why ALIE *raises* the median, Krum and the trimmed mean on the one-class Fashion-MNIST split.

In `evidence_byzantine.json --scale fashion_mnist` (non-IID rows) ALIE lifts the majority-based
rules by 23-58 points over their no-attack accuracy. The explanation this script checks: the five
Byzantine rows are identical, b = mu - z sigma (Baruch, Baruch, Goldberg, NeurIPS 2019, with
n = 25, f = 5: s = floor(n/2 + 1) - f = 8, z = Phi^-1((n - f - s)/(n - f)) = Phi^-1(0.6) = 0.253),
so each lies within a quarter of a standard deviation of the honest mean mu in every coordinate,
and each has four neighbours at distance 0. Krum's score of a Byzantine row (the sum of squared
distances to its n - f - 2 = 18 nearest rows, Blanchard et al., NeurIPS 2017) is then the least,
and Krum returns a row close to the honest mean; the coordinate-wise rules move towards mu too.
Without the attack the rows are 25 one-class gradients, none central.

The check, at the first round of the sweep's setting: the linear model (784 -> 10 softmax
regression) at W = 0, 25 clients with one class each (client c holds class perm[c mod 10]),
clients 1, 2, 3, 14 and 20 Byzantine, every client one batch-32 gradient of its own data. For
each rule it prints the cosine between the aggregate and the honest mean, without attack (25
honest rows; the mean of all 25) and under ALIE (20 honest rows and 5 ALIE rows; the mean of the
20), and which row Krum picks under ALIE. This is the first round only: it shows the mechanism,
not the 600-round accuracy.

    python experiments/byzantine_alie_mechanism.py [--seeds 3] [--data-dir DIR]
"""
import argparse

import jax.numpy as jnp
import numpy as np

from fljax.data.idx import DEBIAN_FASHION_MNIST, load_idx_dataset
from fljax.robustness import aggregators, attacks

BYZANTINE = (1, 2, 3, 14, 20)       # the byzantine wrapper's draw with its seed 24 (see the json)
RULES = {"median": aggregators.coordinate_median,
         "Krum": lambda x, mask: aggregators.krum(x, mask, 5),
         "trimmed mean": lambda x, mask: aggregators.trimmed_mean(x, mask, 5)}


def one_class_gradients(x, y, rng, clients=25, batch=32):
    """[clients, 7840]: each client's gradient of the mean cross-entropy of softmax(x W) at W = 0,
    grad W = x^T (softmax(0) - onehot(y)) / batch, on a batch of its one class."""
    perm = rng.permutation(10)
    rows = []
    for c in range(clients):
        idx = rng.choice(np.flatnonzero(y == perm[c % 10]), batch, replace=False)
        rows.append((x[idx].T @ (np.full((batch, 10), 0.1) - np.eye(10)[y[idx]]) / batch).ravel())
    return np.array(rows)


def cosine(a, b):
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--data-dir", default=DEBIAN_FASHION_MNIST)
    args = parser.parse_args(argv)
    data = load_idx_dataset("fashion_mnist", args.data_dir)
    x = data.x_train.reshape(len(data.x_train), -1).astype(np.float64)
    byzantine = np.isin(np.arange(25), BYZANTINE)
    mask = jnp.ones(25, bool)
    print("seed | rule | cos(aggregate, honest mean): no attack | under ALIE")
    for seed in range(args.seeds):
        rows = one_class_gradients(x, data.y_train, np.random.default_rng(seed))
        attacked = np.asarray(attacks.alie(jnp.asarray(rows), mask, jnp.asarray(byzantine)))
        for name, rule in RULES.items():
            none = cosine(np.asarray(rule(jnp.asarray(rows), mask)), rows.mean(0))
            alie = cosine(np.asarray(rule(jnp.asarray(attacked), mask)), rows[~byzantine].mean(0))
            print(f"{seed} | {name} | {none:+.3f} | {alie:+.3f}")
        picked = int(jnp.argmin(aggregators.krum_scores(jnp.asarray(attacked), mask, 5)))
        print(f"{seed} | Krum picks row {picked} under ALIE: "
              f"{'a Byzantine (ALIE) row' if byzantine[picked] else 'an honest row'}")


if __name__ == "__main__":
    main()
