"""FedBug's theory toy (FedBug (Kao and Wang, 2023) section 4 and appendix B.6): FedAvg vs FedBug on
two clients.

Model f(x) = x [a, b]^T v; client 1 has x1 = [1, 0], y1 = 1 and client 2 has x2 = [0, 1], y2 = 1,
so their losses are L1 = (a v - 1)^2 and L2 = (b v - 1)^2 (the paper's stated squared error; its
gradient-flow derivation drops the factor 2). Every round both clients start from the server's
(a, b, v), take K = 50 SGD steps of lr 0.1 on their own loss, and the server averages the two
models. FedBug freezes the last layer v while k < f (k = 0..K-1), f = P K // 2 (M = 2 units:
[a, b], then v; the official code's schedule, see fljax/algorithms/fedbug.py), then trains all.
(a, b, v) start uniform in [0, 2], 50 seeds, 80 rounds.

Measured per round i at the server model: the loss (L1 + L2) / 2, the client discrepancy
d^i = |a^i - b^i| and the contraction ratio r^i = d^{i+1} / d^i (Definitions 1 and 2).

Figure 2a (theory vs empirical ratio). Theorem 1 (FedAvg; Theorem 3 in appendix B.5) bounds the
ratio by (1 + cos^2(theta) (1 + alpha)) / 2 and Theorem 2 (FedBug, v frozen for the first local
step; Theorem 4, eq. 7) by (1 + m cos^2(theta) (1 + alpha)) / 2 with m = 1 - eta v^2, where theta
is "the angle between the local update direction and the axis of the last layer parameter" and
alpha bounds the error of Assumption 3/6 (the local trajectory taken as a straight line). The
paper "explicitly estimate[s] theta using the gradient of the client model" (appendix B.6):
client 1 moves in the (a, v) plane along -grad L1 = -2 (a v - 1) (v, a), parallel to the model
gradient grad_(a,v) f(x1) = (v, a), so

    cos^2(theta_1) = a^2 / (a^2 + v^2),      cos^2(theta_2) = b^2 / (b^2 + v^2)

(the residual's sign and size drop out), and ``theoretical_ratio`` takes

    r_th = (1 + m cos^2(theta) (1 + alpha)) / 2,    m = (1 - 2 lr v^2)^f,
    cos^2(theta) = (cos^2 theta_1 + cos^2 theta_2) / 2     (f steps with v frozen; FedAvg: f = 0)

at the server model of round i, alpha = 0 (the straight-line limit). m is eq. 7's 1 - eta v^2
for this toy's loss (a v - 1)^2, whose gradient carries the factor 2 the paper's derivation drops
(eta = 2 lr); with v frozen a and b move by (1 - 2 lr v^2) (a - b) exactly, per step. The formula
is the limit of the paper's linearization near the global minimum (a = b = 1 / v; Assumption
1/4) after local convergence: measured (50 seeds, lr 0.1, K = 50), |r - r_th| falls about as
delta^2 with delta^i = max(d^i, |a^i v^i - 1|, |b^i v^i - 1|) the server's distance from the
minima, to < 2e-6 (FedAvg) and < 2e-5 (FedBug) once delta^i < 1e-3; a smaller lr at the same
lr K (gradient flow) does not shrink it, and too few local steps to converge (K = 10) leave an
error that does not vanish. Round 0 (random start) is far from the minimum and off the formula.

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


def update_angles(a, b, v):
    """(theta_1, theta_2): the angle between client c's local update direction in its (w, v)
    plane (w = a for c_1, b for c_2), i.e. its loss gradient 2 (w v - 1) (v, w), and the v
    axis, estimated from the gradient of the client's model f = w v at the server model:
    grad_(w,v) f = (v, w), so theta_c = arctan(|v| / |w|) in [0, pi/2]."""
    return np.arctan2(np.abs(v), np.abs(a)), np.arctan2(np.abs(v), np.abs(b))


def theoretical_ratio(a, b, v, *, lr: float = LR, frozen_v_steps: int = 0,
                      alpha: float = 0.0):
    """The contraction ratio of Theorems 1-2 at the server model (a, b, v) (see the module doc):
    (1 + m cos^2(theta) (1 + alpha)) / 2, cos^2(theta) the two clients' mean, m = (1 - 2 lr v^2)
    ** frozen_v_steps (FedAvg: 1)."""
    theta_1, theta_2 = update_angles(a, b, v)
    cos2 = (np.cos(theta_1) ** 2 + np.cos(theta_2) ** 2) / 2.0
    m = (1.0 - 2.0 * lr * v ** 2) ** frozen_v_steps
    return (1.0 + m * cos2 * (1.0 + alpha)) / 2.0


def run(fraction: float, *, seeds: int = SEEDS, rounds: int = ROUNDS, steps: int = LOCAL_STEPS,
        lr: float = LR) -> dict[str, np.ndarray]:
    """Per seed and round: server loss (seeds, rounds+1), d (seeds, rounds+1), r (seeds, rounds;
    nan once d^i < D_FLOOR), the server models a, b, v (seeds, rounds+1), the theoretical ratio
    r_th at round i's server model (seeds, rounds; ``theoretical_ratio``) and delta (seeds,
    rounds+1), the server model's distance max(d, |a v - 1|, |b v - 1|) from the minima.

    ``fraction`` is FedBug's GU fraction P (0 is FedAvg). Seed s draws (a, b, v) from
    np.random.default_rng(s), so every fraction starts from the same models.
    """
    init = np.stack([np.random.default_rng(s).uniform(0.0, 2.0, 3) for s in range(seeds)])
    a, b, v = init.T
    frozen_v_steps = int(fraction * steps // 2)
    models = []
    for _ in range(rounds + 1):
        models.append((a, b, v))
        a1, v1 = local_sgd(a, v, steps, lr, frozen_v_steps)   # client 1 (b untouched)
        b2, v2 = local_sgd(b, v, steps, lr, frozen_v_steps)   # client 2 (a untouched)
        a, b, v = (a1 + a) / 2.0, (b + b2) / 2.0, (v1 + v2) / 2.0
    a, b, v = (np.stack(m, 1) for m in zip(*models))
    loss = ((a * v - 1.0) ** 2 + (b * v - 1.0) ** 2) / 2.0
    gap = np.abs(a - b)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(gap[:, :-1] > D_FLOOR, gap[:, 1:] / gap[:, :-1], np.nan)
    theory = theoretical_ratio(a[:, :-1], b[:, :-1], v[:, :-1], lr=lr,
                               frozen_v_steps=frozen_v_steps)
    delta = np.maximum(gap, np.maximum(np.abs(a * v - 1.0), np.abs(b * v - 1.0)))
    return {"loss": loss, "d": gap, "r": ratio, "a": a, "b": b, "v": v, "theory": theory,
            "delta": delta}


THEORY_DELTA = 1e-3    # near the minima: delta^i below this
THEORY_D_MIN = 1e-8    # and d^i above this (r^i is a ratio of differences of numbers ~1)


def theory_error(res: dict[str, np.ndarray], *, below: float = THEORY_DELTA) -> np.ndarray:
    """|r^i - r_th^i| over the seeds and rounds whose server model is near the minima
    (delta^i < ``below``, d^i > THEORY_D_MIN)."""
    near = (res["delta"][:, :-1] < below) & (res["d"][:, :-1] > THEORY_D_MIN)
    return np.abs(res["r"] - res["theory"])[near]


def summary(results: dict[str, dict[str, np.ndarray]]) -> str:
    """Markdown table: mean loss at rounds 5/10/20 and at the end, the mean contraction ratio
    over all seeds and rounds where it is defined (d^i >= D_FLOOR), and the largest
    |r - r_th| near the minima (Figure 2a)."""
    lines = ["| method | loss@5 | loss@10 | loss@20 | final loss | mean r | "
             f"max abs(r - r_th), delta < {THEORY_DELTA:g} |",
             "|---|---|---|---|---|---|---|"]
    for label, res in results.items():
        loss, r = res["loss"], res["r"]
        lines.append(f"| {label} | {loss[:, 5].mean():.3e} | {loss[:, 10].mean():.3e} | "
                     f"{loss[:, 20].mean():.3e} | {loss[:, -1].mean():.3e} | "
                     f"{np.nanmean(r):.4f} | {theory_error(res).max():.1e} |")
    return "\n".join(lines)


def plot(results: dict[str, dict[str, np.ndarray]], out: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_theory, ax_loss, ax_ratio) = plt.subplots(1, 3, figsize=(15, 4))
    for label, res in results.items():
        ax_loss.semilogy(res["loss"].mean(0), label=label)
        defined = ~np.isnan(res["r"])
        ratio = np.nansum(res["r"], 0) / np.maximum(defined.sum(0), 1)
        ax_ratio.plot(np.where(defined.any(0), ratio, np.nan), label=label)
        shown = defined & (res["d"][:, :-1] > THEORY_D_MIN)
        ax_theory.scatter(res["theory"][shown], res["r"][shown], s=3, alpha=0.4, label=label)
    ax_theory.plot([0.5, 1.0], [0.5, 1.0], "k--", lw=0.8, label="r = r_th")
    ax_theory.set(xlabel="theoretical ratio (1 + m cos^2(theta)) / 2",
                  ylabel="empirical ratio d^{i+1} / d^i", title="Figure 2a", xlim=(0.45, 1.02),
                  ylim=(0.45, 1.02))
    ax_loss.set(xlabel="round", ylabel="mean server loss (L1 + L2) / 2")
    ax_ratio.set(xlabel="round i", ylabel="mean contraction ratio d^{i+1} / d^i (d^i >= 1e-12)",
                 ylim=(0, 1.2))
    for ax in (ax_theory, ax_loss, ax_ratio):
        ax.legend()
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
