"""A learning curve: the weight snapshots one tool wrote while training, their grades, and when to write them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Snapshot:
    train_s: float  # training wall-clock when it was written
    step: int
    path: Path


@dataclass(kw_only=True)
class Curve:
    """One tool's run: snapshots, then their grades; the training reward and seconds of each step."""

    tool: str
    snapshots: list[Snapshot]
    step_rewards: list[float]
    train_s: float
    startup_s: float
    step_metrics: list[dict[str, float]] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)  # a few sampled completions (episodes) of each step
    accuracy: list[float] = field(default_factory=list)  # per snapshot, filled by `grade_curve`
    sampled: dict[int, float] = field(default_factory=dict)  # snapshot index -> sampled accuracy (first and last)
    by_group: list[dict[str, float]] = field(default_factory=list)  # per snapshot: held-out metrics per task group

    @property
    def steps(self) -> int:
        return len(self.step_rewards)


class Marks:
    """When to snapshot: every `every_s` of training time, and at the end."""

    def __init__(self, budget_s: float, every_s: float) -> None:
        self.budget_s, self.every_s, self.next_s = budget_s, every_s, every_s

    def due(self, train_s: float) -> bool:
        if train_s >= self.next_s:
            self.next_s = (train_s // self.every_s + 1) * self.every_s
            return True
        return False

    def over(self, train_s: float) -> bool:
        return train_s >= self.budget_s


def minutes_to_reach(curve: Curve, target: float) -> float | None:
    """Training minutes of the first snapshot at or above `target` (None: never)."""
    return next((s.train_s / 60 for s, a in zip(curve.snapshots, curve.accuracy) if a >= target), None)
