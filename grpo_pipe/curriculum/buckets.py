"""Difficulty buckets from a reward distribution: min-max normalise, fit a Gaussian KDE, cut at its valleys.

Unlike a split at fixed quantiles, the cuts fall where few tasks are (between the modes of the
reward distribution), so each bucket holds one mode and a unimodal distribution stays one bucket.
Pure functions of the rewards: no state, no RNG.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, cast

import numpy as np

GRID_POINTS = 512  # KDE evaluation points over the normalised range [0, 1]
# A valley must dip this far (as a fraction of the highest density) below the lower of its two
# neighbouring peaks; shallower dips are wiggles of the estimate, not gaps between groups of tasks.
MIN_VALLEY_PROMINENCE = 0.05

Bandwidth = float | Literal["scott", "silverman"]


@dataclass(frozen=True, kw_only=True)
class Bucket:
    """Tasks whose EMA reward lies in [low, high) (the last bucket includes `high`).

    Args:
        label: Its difficulty, "hard" ... "easy".
        low: Its lower edge, on the reward scale.
        high: Its upper edge, on the reward scale.
        count: How many tasks it holds.
        mean_reward: The mean EMA reward of its tasks.
        normalised_mean: The same after min-max normalisation: 0 = hardest seen, 1 = easiest.
        rollouts: Samples per prompt for its tasks.
    """

    label: str
    low: float
    high: float
    count: int
    mean_reward: float
    normalised_mean: float
    rollouts: int


@dataclass(frozen=True, kw_only=True)
class BucketFit:
    """One fit: the buckets plus what a report needs to show how they were found.

    Args:
        rewards: The EMA rewards that were fit.
        boundaries: The cuts between buckets, ascending, on the reward scale.
        buckets: The buckets, ascending in reward: hardest first.
        grid: The points the KDE was evaluated at, on the reward scale.
        density: The KDE density per unit of reward at each grid point; all 0 when no KDE could be fit.
        bandwidth: The KDE bandwidth on the normalised scale (0 when no KDE).
        unseen_tasks: Tasks with no reward yet (not fit; they get `default_rollouts`).
        default_rollouts: Samples per prompt of a task of middle difficulty.
        stats: Global stats of `rewards` (tasks, mean, std, min, median, max).
    """

    rewards: list[float]  # [T]
    boundaries: list[float]  # [B - 1]
    buckets: list[Bucket]  # [B]
    grid: list[float]  # [G]
    density: list[float]  # [G]
    bandwidth: float
    unseen_tasks: int = 0
    default_rollouts: int = 0
    stats: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def bucket_index(boundaries: Sequence[float], reward: float) -> int:
    """Which bucket a reward falls in, given ascending boundaries on the reward scale."""
    return bisect.bisect_right(list(boundaries), reward)


def normalise(values: np.ndarray) -> np.ndarray:
    """Min-max to [0, 1]. All-equal values map to 0.5: with no spread there is no evidence that any
    task is harder than another, so all count as middle difficulty."""
    span = float(np.ptp(values)) if values.size else 0.0
    return (values - values.min()) / span if span > 0 else np.full_like(values, 0.5)


def rollouts_for(normalised_mean: float, base: int, alpha: float) -> int:
    """base × (1 + α·(1 − normalised mean reward)): harder buckets get more samples, never fewer than 2."""
    return max(2, round(base * (1.0 + alpha * (1.0 - normalised_mean))))


def bucket_labels(count: int) -> list[str]:
    """Names in ascending reward order."""
    if count == 1:
        return ["all"]
    if count == 2:
        return ["hard", "easy"]
    if count == 3:
        return ["hard", "medium", "easy"]
    return ["hard", *[f"medium-{i}" for i in range(1, count - 1)], "easy"]


def kde_density(normalised: np.ndarray, grid: np.ndarray, bandwidth: Bandwidth) -> tuple[np.ndarray, float]:
    """Gaussian KDE of `normalised` evaluated on `grid` ([G]); zeros when the points have no spread."""
    from scipy.stats import gaussian_kde

    if normalised.size < 2 or np.ptp(normalised) == 0:
        return np.zeros_like(grid), 0.0
    try:
        kde = gaussian_kde(normalised, bw_method=bandwidth)
    except np.linalg.LinAlgError:  # singular covariance: effectively a single value
        return np.zeros_like(grid), 0.0
    factor = cast(float, kde.factor)  # scipy documents a float; its inferred type is a wide union
    return kde(grid), float(factor * np.std(normalised, ddof=1))


def valleys(grid: np.ndarray, density: np.ndarray, max_count: int) -> list[float]:
    """Grid positions of the `max_count` most prominent local minima of `density`, ascending."""
    from scipy.signal import find_peaks

    if max_count < 1 or not density.any():
        return []
    minima, props = find_peaks(-density, prominence=MIN_VALLEY_PROMINENCE * float(density.max()))
    deepest = minima[np.argsort(props["prominences"])[::-1][:max_count]]
    return sorted(float(grid[i]) for i in deepest)


def fit_buckets(
    rewards: Sequence[float], max_buckets: int, base: int, alpha: float, bandwidth: Bandwidth = "scott"
) -> BucketFit:
    """Split `rewards` into at most `max_buckets` buckets at the KDE's valleys; rollouts per bucket."""
    values = np.asarray(rewards, dtype=np.float64)  # [T]
    if values.size == 0:
        raise ValueError("fit_buckets needs at least one reward")
    low, span = float(values.min()), float(np.ptp(values))
    normalised = normalise(values)  # [T] in [0, 1]
    grid = np.linspace(0.0, 1.0, GRID_POINTS)  # [G]
    density, bw = kde_density(normalised, grid, bandwidth)  # [G] per unit of normalised reward
    cuts = valleys(grid, density, max_buckets - 1)  # normalised scale
    members = np.searchsorted(np.asarray(cuts), normalised, side="right")  # [T] bucket index
    edges = [0.0, *cuts, 1.0]
    labels = bucket_labels(len(cuts) + 1)
    buckets = []
    for index, label in enumerate(labels):
        inside = normalised[members == index]
        # An empty bucket (possible only in degenerate fits) is placed at its middle.
        norm_mean = float(inside.mean()) if inside.size else (edges[index] + edges[index + 1]) / 2
        buckets.append(
            Bucket(
                label=label,
                low=low + edges[index] * span,
                high=low + edges[index + 1] * span,
                count=int(inside.size),
                mean_reward=low + norm_mean * span,
                normalised_mean=norm_mean,
                rollouts=rollouts_for(norm_mean, base, alpha),
            )
        )
    return BucketFit(
        rewards=values.tolist(),
        boundaries=[low + c * span for c in cuts],
        buckets=buckets,
        grid=(low + grid * span).tolist(),
        density=(density / span if span > 0 else density).tolist(),  # per unit of reward
        bandwidth=bw,
        default_rollouts=rollouts_for(0.5, base, alpha),
        stats=_stats(values),
    )


def _stats(values: np.ndarray) -> dict[str, float]:
    return {
        "tasks": float(values.size),
        "mean": float(values.mean()),
        "std": float(values.std()),
        "min": float(values.min()),
        "median": float(np.median(values)),
        "max": float(values.max()),
    }
