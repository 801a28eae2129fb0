"""What a run's loop accumulates over all its steps, in memory that does not grow with them.

A loop of days runs hundreds of thousands of steps: anything kept per step for the end-of-run summary would grow
without bound (the tiny job grew by about 10 KB a step, most of it the samples table: BENCHMARKS.md, "Long runs").
Here the samples table goes to a file as it is made, the overlap of generation and training is folded into running
totals, and the phase medians come from a bounded, seeded sample of the steps.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from grpo_pipe.rollout.scheduler import covered_seconds, overlap_seconds


class SamplesTable:
    """The samples table of this process's loop (`run.samples_to_log` rows a step), appended to a JSON-lines file as
    each step is scored and read back once, when the run logs it: the loop keeps no row in memory (in memory it grew
    by about 7 KB a step at 16 rows, without bound). Without a file (tests) the rows stay in a list.

    Args:
        path: The JSON-lines file the rows are appended to; None: the rows stay in a list.
    """

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._rows: list[dict[str, Any]] = []  # only without a file
        self._count = 0
        self._written = False  # the file is started (truncated) by the first write of this process

    def extend(self, rows: Sequence[dict[str, Any]]) -> None:
        self._count += len(rows)
        if self.path is None:
            self._rows.extend(rows)
            return
        if not rows:
            return
        with open(self.path, "a" if self._written else "w", encoding="utf-8") as out:
            out.writelines(json.dumps(row, default=str) + "\n" for row in rows)
        self._written = True

    def rows(self) -> list[dict[str, Any]]:
        if self.path is None:
            return list(self._rows)
        if not self._written:
            return []
        with open(self.path, encoding="utf-8") as lines:
            return [json.loads(line) for line in lines]

    def __len__(self) -> int:
        return self._count


class OverlapMeter:
    """The trainer's busy time, the engine's, and the time both were busy, over the whole loop, in bounded memory:
    the newest `keep` spans of each kind are kept as spans; everything before the earliest of them is folded into
    running totals (exact: no span kept or to come starts before that line, unless it arrives `keep` steps late, and
    then only its part after the line counts).

    Args:
        keep: The newest spans of each kind kept as spans; older ones are folded into the running totals.
    """

    def __init__(self, keep: int = 256) -> None:
        self.keep = keep
        self.train: list[tuple[float, float]] = []
        self.generation: list[tuple[float, float]] = []
        self.line = float("-inf")
        self.folded_train_s = self.folded_generation_s = self.folded_both_s = 0.0

    def add_train(self, span: tuple[float, float]) -> None:
        self._add(self.train, span)

    def add_generation(self, spans: Sequence[tuple[float, float]]) -> None:
        for span in spans:
            self._add(self.generation, span)

    def _add(self, spans: list[tuple[float, float]], span: tuple[float, float]) -> None:
        start, end = max(span[0], self.line), span[1]
        if end > start:
            spans.append((start, end))
        if len(self.train) + len(self.generation) > 4 * self.keep:
            self._fold()

    def _fold(self) -> None:
        newest = self.train[-self.keep:] + self.generation[-self.keep:]
        line = min(start for start, _ in newest)
        before_train = [(s, min(e, line)) for s, e in self.train if s < line]
        before_generation = [(s, min(e, line)) for s, e in self.generation if s < line]
        self.folded_train_s += covered_seconds(before_train)
        self.folded_generation_s += covered_seconds(before_generation)
        self.folded_both_s += overlap_seconds(before_train, before_generation)
        self.train = [(max(s, line), e) for s, e in self.train if e > line]
        self.generation = [(max(s, line), e) for s, e in self.generation if e > line]
        self.line = line

    def train_s(self) -> float:
        return self.folded_train_s + covered_seconds(self.train)

    def generation_s(self) -> float:
        return self.folded_generation_s + covered_seconds(self.generation)

    def both_s(self) -> float:
        return self.folded_both_s + overlap_seconds(self.train, self.generation)


class StepTimes:
    """Each step's phase seconds (by PHASES' names) for the end-of-run summary, in bounded memory: the mean step time
    as a running sum, the first step on its own, and the medians over a uniform sample of at most `kept` of the other
    steps (exact for runs up to `kept` + 1 steps; reservoir sampling, seeded, beyond).

    Args:
        kept: The most steps (after the first) kept for the medians.
    """

    def __init__(self, kept: int = 2048) -> None:
        self.kept = kept
        self.count = 0
        self.total_step_s = 0.0
        self.first: dict[str, float] | None = None
        self.sample: list[dict[str, float]] = []
        self._rng = random.Random(0)

    def add(self, phases: dict[str, float]) -> None:
        self.count += 1
        self.total_step_s += phases.get("step_s", 0.0)
        if self.first is None:
            self.first = phases
        elif len(self.sample) < self.kept:
            self.sample.append(phases)
        else:
            slot = self._rng.randrange(self.count - 1)  # the later steps seen so far, the first left out
            if slot < self.kept:
                self.sample[slot] = phases

    def for_medians(self) -> list[dict[str, float]]:
        """The first step also waits for the first batch and warms up: left out when there are three steps or more."""
        if self.first is None:
            return []
        return self.sample if self.count >= 3 else [self.first, *self.sample]
