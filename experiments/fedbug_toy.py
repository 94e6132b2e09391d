"""FedBug's theory toy (fedbug.txt section 4 and appendix B.6): FedAvg vs FedBug on two clients.

Model f(x) = x [a, b]^T v; client 1 has x1 = [1, 0], y1 = 1 and client 2 has x2 = [0, 1], y2 = 1,
so their losses are L1 = (a v - 1)^2 and L2 = (b v - 1)^2 (the paper's stated squared error; its
gradient-flow derivation drops the factor 2). Every round both clients start from the server's
(a, b, v), take K = 50 SGD steps of lr 0.1 on their own loss, and the server averages the two
models. FedBug freezes the last layer v while k < f (k = 0..K-1), f = P K // 2 (M = 2 units:
[a, b], then v; the official code's schedule, see fljax/algorithms/fedbug.py), then trains all.
(a, b, v) start uniform in [0, 2], 50 seeds, 80 rounds.

Measured per round i at the server model: the loss (L1 + L2) / 2, the client discrepancy
d^i = |a^i - b^i| and the contraction ratio r^i = d^{i+1} / d^i (Definitions 1 and 2).

    python experiments/fedbug_toy.py --out runs/fedbug_toy.png
"""

from __future__ import annotations

import argparse

import numpy as np

LR, LOCAL_STEPS, ROUNDS, SEEDS = 0.1, 50, 80, 50
D_FLOOR = 1e-12   # below this d is float64 rounding noise (a, b ~ 1): r is left undefined (nan)


def local_sgd(w, v, steps, lr, frozen_v_steps):
    """SGD on (w v - 1)^2 for the client's own first-layer weight w and the shared v."""
    for k in range(steps):
        residual = w * v - 1.0
        grad_w, grad_v = 2.0 * v * residual, 2.0 * w * residual
        w = w - lr * grad_w
        if k >= frozen_v_steps:
            v = v - lr * grad_v
    return w, v


def run(fraction: float, *, seeds: int = SEEDS, rounds: int = ROUNDS, steps: int = LOCAL_STEPS,
        lr: float = LR) -> dict[str, np.ndarray]:
    """Per seed and round: server loss (seeds, rounds+1), d (seeds, rounds+1), r (seeds, rounds;
    nan once d^i < D_FLOOR).

    ``fraction`` is FedBug's GU fraction P (0 is FedAvg). Seed s draws (a, b, v) from
    np.random.default_rng(s), so every fraction starts from the same models.
    """
    init = np.stack([np.random.default_rng(s).uniform(0.0, 2.0, 3) for s in range(seeds)])
    a, b, v = init.T
    frozen_v_steps = int(fraction * steps // 2)
    losses, gaps = [], []
    for _ in range(rounds + 1):
        losses.append(((a * v - 1.0) ** 2 + (b * v - 1.0) ** 2) / 2.0)
        gaps.append(np.abs(a - b))
        a1, v1 = local_sgd(a, v, steps, lr, frozen_v_steps)   # client 1 (b untouched)
        b2, v2 = local_sgd(b, v, steps, lr, frozen_v_steps)   # client 2 (a untouched)
        a, b, v = (a1 + a) / 2.0, (b + b2) / 2.0, (v1 + v2) / 2.0
    loss, gap = np.stack(losses, 1), np.stack(gaps, 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(gap[:, :-1] > D_FLOOR, gap[:, 1:] / gap[:, :-1], np.nan)
    return {"loss": loss, "d": gap, "r": ratio}


def summary(results: dict[str, dict[str, np.ndarray]]) -> str:
    """Markdown table: mean loss at rounds 5/10/20 and at the end, and the mean contraction
    ratio over all seeds and rounds where it is defined (d^i >= D_FLOOR)."""
    lines = ["| method | loss@5 | loss@10 | loss@20 | final loss | mean r |",
             "|---|---|---|---|---|---|"]
    for label, res in results.items():
        loss, r = res["loss"], res["r"]
        lines.append(f"| {label} | {loss[:, 5].mean():.3e} | {loss[:, 10].mean():.3e} | "
                     f"{loss[:, 20].mean():.3e} | {loss[:, -1].mean():.3e} | "
                     f"{np.nanmean(r):.4f} |")
    return "\n".join(lines)


def plot(results: dict[str, dict[str, np.ndarray]], out: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_ratio) = plt.subplots(1, 2, figsize=(10, 4))
    for label, res in results.items():
        ax_loss.semilogy(res["loss"].mean(0), label=label)
        defined = ~np.isnan(res["r"])
        ratio = np.nansum(res["r"], 0) / np.maximum(defined.sum(0), 1)
        ax_ratio.plot(np.where(defined.any(0), ratio, np.nan), label=label)
    ax_loss.set(xlabel="round", ylabel="mean server loss (L1 + L2) / 2")
    ax_ratio.set(xlabel="round i", ylabel="mean contraction ratio d^{i+1} / d^i (d^i >= 1e-12)",
                 ylim=(0, 1.2))
    ax_loss.legend()
    ax_ratio.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="fedbug_toy.png", help="PNG path of the plot")
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.04, 0.2, 0.4],
                        help="FedBug GU fractions P to compare with FedAvg (P=0.04: v frozen "
                             "for 1 local step, the case of Theorem 2)")
    parser.add_argument("--seeds", type=int, default=SEEDS)
    args = parser.parse_args(argv)
    results = {"FedAvg": run(0.0, seeds=args.seeds)}
    for p in args.fractions:
        results[f"FedBug ({p:g})"] = run(p, seeds=args.seeds)
    print(summary(results))
    plot(results, args.out)
    print(f"plot: {args.out}")


if __name__ == "__main__":
    main()
