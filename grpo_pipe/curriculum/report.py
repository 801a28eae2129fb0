"""The per-epoch cluster report of the KDE bucket curriculum: text, JSON and a PNG of the fit."""

from __future__ import annotations

import json
from pathlib import Path

from grpo_pipe.curriculum.buckets import BucketFit


def render_text(fit: BucketFit, epoch: int) -> str:
    """Global stats, boundaries and one row per bucket, as a fixed-width table."""
    s = fit.stats
    lines = [
        f"Curriculum epoch {epoch}: {int(s['tasks'])} tasks with a reward history, {fit.unseen_tasks} not seen yet "
        f"(middle difficulty: {fit.default_rollouts} rollouts)",
        f"EMA reward: mean {s['mean']:.4f}  std {s['std']:.4f}  min {s['min']:.4f}  "
        f"median {s['median']:.4f}  max {s['max']:.4f}  (KDE bandwidth {fit.bandwidth:.4f} normalised)",
        "Boundaries: " + (", ".join(f"{b:.4f}" for b in fit.boundaries) or "none (one mode)"),
        f"{'bucket':<10} {'reward range':^22} {'count':>7} {'share':>7} {'mean':>9} {'rollouts':>9}",
    ]
    total = sum(b.count for b in fit.buckets) or 1
    for b in fit.buckets:
        lines.append(
            f"{b.label:<10} {b.low:>9.4f} .. {b.high:<9.4f} {b.count:>7d} {b.count / total:>7.1%} "
            f"{b.mean_reward:>9.4f} {b.rollouts:>9d}"
        )
    return "\n".join(lines)


def write_report(fit: BucketFit, epoch: int, output_dir: Path) -> list[Path]:
    """`epoch_NNN.txt`, `.json` and `.png` under `output_dir`; returns the three paths."""
    output_dir.mkdir(parents=True, exist_ok=True)
    stem = output_dir / f"epoch_{epoch:03d}"
    text, data, image = stem.with_suffix(".txt"), stem.with_suffix(".json"), stem.with_suffix(".png")
    text.write_text(render_text(fit, epoch) + "\n")
    data.write_text(json.dumps({"epoch": epoch, **fit.as_dict()}, indent=1))
    plot_fit(fit, epoch, image)
    return [text, data, image]


def plot_fit(fit: BucketFit, epoch: int, path: Path) -> None:
    """Histogram of the EMA rewards, the KDE curve and the boundaries, on the reward scale."""
    # The Agg canvas directly: no pyplot, so no global figure state and no display needed.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8.5, 4), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    axes.hist(fit.rewards, bins=min(50, max(5, len(fit.rewards) // 5)), density=True, alpha=0.5, label="EMA rewards")
    if any(fit.density):
        axes.plot(fit.grid, fit.density, color="black", label="KDE")
    for index, boundary in enumerate(fit.boundaries):
        axes.axvline(boundary, color="red", linestyle="--", label="boundaries" if index == 0 else None)
    for bucket in fit.buckets:
        axes.annotate(
            f"{bucket.label}\n{bucket.count} tasks, {bucket.rollouts} rollouts",
            xy=((bucket.low + bucket.high) / 2, 1.0), xycoords=("data", "axes fraction"),
            ha="center", va="top", fontsize=8,
        )
    axes.set_xlabel("EMA reward per task")
    axes.set_ylabel("density")
    axes.set_title(f"Curriculum epoch {epoch}: {len(fit.buckets)} bucket(s)")
    axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)  # beside the plot, never over it
    figure.tight_layout()
    figure.savefig(path)
