"""``fljax plot RUN_DIR... --out FILE.png``: accuracy and loss curves of one or more runs."""

from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from fljax.errors import FljaxError  # noqa: E402
from fljax.logs import read_log  # noqa: E402


def plot_runs(run_dirs: list[str], out: str) -> str:
    """Draw test accuracy and train loss per round of each run into ``out`` (PNG), written whole
    or not at all."""
    fig, (acc_ax, loss_ax) = plt.subplots(1, 2, figsize=(11, 4))
    for run_dir in run_dirs:
        records = read_log(os.path.join(run_dir, "metrics.jsonl"))
        if not records:
            raise FljaxError(f"{run_dir!r} has no metrics.jsonl records; pass run directories "
                             f"written by fljax")
        label = os.path.basename(os.path.normpath(run_dir))
        evals = [r for r in records if r["kind"] == "eval"]
        rounds = [r for r in records if r["kind"] == "round"]
        acc_ax.plot([r["round"] for r in evals], [r["accuracy"] for r in evals], marker="o",
                    markersize=3, label=label)
        loss_ax.plot([r["round"] for r in rounds], [r["train_loss"] for r in rounds], label=label)
    acc_ax.set(xlabel="round", ylabel="test accuracy", title="Global model accuracy")
    loss_ax.set(xlabel="round", ylabel="train loss", title="Mean local training loss",
                yscale="log")
    for ax in (acc_ax, loss_ax):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    root, ext = os.path.splitext(out)
    tmp = f"{root}.tmp{ext}"   # same extension: the format follows it
    try:
        fig.savefig(tmp, dpi=120)
        os.replace(tmp, out)
    except OSError as e:
        raise FljaxError(f"cannot write plot to {out!r} ({e.strerror})") from None
    finally:
        plt.close(fig)
    return out
