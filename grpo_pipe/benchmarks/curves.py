"""A learning curve: the weight snapshots one tool wrote while training, their grades, and when to write them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Snapshot:
    """One weight snapshot a tool wrote while training.

    Args:
        train_s: Training wall-clock when it was written.
        step: The optimizer steps taken before it.
        path: The folder it was written to.
    """

    train_s: float
    step: int
    path: Path


@dataclass(kw_only=True)
class Curve:
    """One tool's run: snapshots, then their grades; the training reward and seconds of each step.

    Args:
        tool: The tool that trained (`grpo_pipe`, `trl`).
        snapshots: The weight snapshots it wrote, in order.
        step_rewards: The mean training reward of each step.
        train_s: Training wall-clock, start-up excluded.
        startup_s: Seconds before the first step (model load, engine start-up).
        step_metrics: The metrics each step logged.
        samples: A few sampled completions (episodes) of each step.
        accuracy: Per snapshot, filled by `grade_curve`.
        sampled: Snapshot index -> sampled accuracy (first and last).
        by_group: Per snapshot: held-out metrics per task group.
    """

    tool: str
    snapshots: list[Snapshot]
    step_rewards: list[float]
    train_s: float
    startup_s: float
    step_metrics: list[dict[str, float]] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)
    accuracy: list[float] = field(default_factory=list)
    sampled: dict[int, float] = field(default_factory=dict)
    by_group: list[dict[str, float]] = field(default_factory=list)

    @property
    def steps(self) -> int:
        return len(self.step_rewards)


class Marks:
    """When to snapshot: every `every_s` of training time, and at the end.

    Args:
        budget_s: Training seconds after which the run ends.
        every_s: Training seconds between snapshots.
    """

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
