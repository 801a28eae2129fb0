"""A sweep's answer with its margin: which setting won, by how much, and whether that is more than the noise.

The children of a sweep that differ only in `run.seed` are repeats of one point. Each point gets the mean of its
repeats' final objective and their spread (sample standard deviation). The leader is a winner only where its mean
is further from the runner-up's than either point's spread; inside the spread the answer is a tie. With one seed
per point there is no spread to compare with, and the answer says the margin is unknown and how to measure it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from grpo_pipe.tracking.sweep_runs import ChildResult

SEED_KEY = "run.seed"


@dataclass(frozen=True)
class Point:
    """One setting of the swept keys other than the seed, over the seeds it ran with.

    Args:
        label: The setting, `key=value` of each swept key other than the seed (`all runs` where there is none).
        values: The final objective of each repeat that logged it.
    """

    label: str
    values: tuple[float, ...]

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values)

    @property
    def spread(self) -> float | None:
        """Sample standard deviation over the repeats; None with fewer than two."""
        return statistics.stdev(self.values) if len(self.values) > 1 else None

    def shown(self) -> str:
        spread = "" if self.spread is None else f" ± {self.spread:.3g}"
        seeds = f"{len(self.values)} seed{'s' if len(self.values) != 1 else ''}"
        return f"{self.label}: {self.mean:.4g}{spread} ({seeds})"


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """The sweep's answer: which setting did best on its objective, over the seeds.

    Args:
        objective: The metric key compared (`run.objective`).
        direction: `maximize` or `minimize`.
        points: Every setting over its seeds, best first.
        text: The answer in one sentence.
    """

    objective: str
    direction: str
    points: tuple[Point, ...]
    text: str


def points_of(children: Sequence[ChildResult], swept: Sequence[str]) -> list[Point]:
    """The children grouped by their swept values other than the seed, in the order they first ran."""
    keys = [k for k in swept if k != SEED_KEY]
    grouped: dict[str, list[float]] = {}
    for child in children:
        # A space inside a setting and "; " between settings: a comma alone could not tell where one ends.
        label = " ".join(f"{k}={child.overrides[k]}" for k in keys if k in child.overrides) or "all runs"
        value = child.last.get(child.objective)
        values = grouped.setdefault(label, [])
        if value is not None and math.isfinite(value):
            values.append(value)
    return [Point(label, tuple(values)) for label, values in grouped.items() if values]


def verdict(children: Sequence[ChildResult], swept: Sequence[str]) -> Verdict | None:
    """The sweep's answer; None when no child logged its objective."""
    if not children:
        return None
    objective, direction = children[0].objective, children[0].direction
    sign = -1.0 if direction == "minimize" else 1.0
    points = sorted(points_of(children, swept), key=lambda p: -sign * p.mean)
    if not points:
        return None
    return Verdict(objective=objective, direction=direction, points=tuple(points), text=_answer(points, objective))


def _answer(points: Sequence[Point], objective: str) -> str:
    leader = points[0]
    if len(points) == 1:
        return f"One setting: {leader.shown()}."
    runner_up = points[1]
    gap = abs(leader.mean - runner_up.mean)
    tied = [p for p in points if p.mean == leader.mean]
    if len(tied) > 1:
        return f"Tie on {objective} at {leader.mean:.4g}: {'; '.join(p.label for p in tied)}."
    spreads = [p.spread for p in (leader, runner_up)]
    if any(s is None for s in spreads):
        return (f"{leader.label} leads on {objective} by {gap:.3g} over {runner_up.label} "
                f"({leader.mean:.4g} against {runner_up.mean:.4g}); margin unknown: one seed per point "
                f"(repeat the sweep over seeds, e.g. {SEED_KEY}=0,1,2, to measure it).")
    noise = max(s for s in spreads if s is not None)
    if gap <= noise:
        return (f"Tie within the spread on {objective}: {leader.shown()} and {runner_up.shown()} differ by "
                f"{gap:.3g}, less than their spread ({noise:.3g}).")
    return (f"{leader.label} wins on {objective}: {leader.shown()} against {runner_up.shown()}; the gap "
            f"({gap:.3g}) is more than either spread.")
