"""``fljax plot RUN_DIR... [--metrics a,b] --out FILE.png``: curves of one or more runs."""

from __future__ import annotations

import math
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from fljax.errors import FljaxError  # noqa: E402
from fljax.runner.logs import read_log  # noqa: E402

DEFAULT_METRICS = ("accuracy", "train_loss")
TITLES = {"accuracy": "Global model test accuracy", "train_loss": "Mean local training loss"}


def series(records: list[dict], metric: str) -> tuple[list[int], list[float]]:
    """(rounds, values) of ``metric``: from the round records if they have it (a value per
    round: train loss, probes), else from the evaluations (test scores, evaluation probes)."""
    for kind in ("round", "eval"):
        points = [(r["round"], r[metric]) for r in records
                  if r["kind"] == kind and isinstance(r.get(metric), (int, float))]
        if points:
            return [p[0] for p in points], [p[1] for p in points]
    return [], []


def plot_runs(run_dirs: list[str], out: str, metrics: list[str] | None = None) -> str:
    """Draw each of ``metrics`` (default: test accuracy and train loss) per round for each run
    into ``out`` (PNG), one panel per metric; the file is written whole or not at all."""
    metrics = list(metrics or DEFAULT_METRICS)
    runs = {}
    for run_dir in run_dirs:
        records = read_log(os.path.join(run_dir, "metrics.jsonl"))
        if not records:
            raise FljaxError(f"{run_dir!r} has no metrics.jsonl records; pass run directories "
                             f"written by fljax")
        runs[os.path.basename(os.path.normpath(run_dir))] = records
    missing = [m for m in metrics if not any(series(r, m)[0] for r in runs.values())]
    if missing:
        raise FljaxError(f"no run logged {missing}; run with the probe that computes it "
                         f"(fljax --probes ...)")
    fig, axes = plt.subplots(1, len(metrics), figsize=(5.5 * len(metrics), 4), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        for label, records in runs.items():
            rounds, values = series(records, metric)
            ax.plot(rounds, values, marker="o" if len(rounds) < 30 else None, markersize=3,
                    label=label)
            if metric.endswith("loss") and all(v > 0 for v in values if math.isfinite(v)):
                ax.set_yscale("log")
        ax.set(xlabel="round", ylabel=metric, title=TITLES.get(metric, metric))
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
