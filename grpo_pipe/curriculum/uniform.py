"""Uniform curriculum: shuffled passes over the train split, a fixed group size for every prompt."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from grpo_pipe.types import Task


class UniformCurriculum:
    def __init__(self, prompts_per_step: int = 8, samples_per_prompt: int = 8, seed: int = 0) -> None:
        if prompts_per_step < 1 or samples_per_prompt < 2:
            raise ValueError(
                f"curriculum.prompts_per_step={prompts_per_step} must be >= 1 and "
                f"curriculum.samples_per_prompt={samples_per_prompt} >= 2 (GRPO compares samples within a group)"
            )
        self.prompts_per_step = prompts_per_step
        self.samples_per_prompt = samples_per_prompt
        self.seed = seed
        self.tasks: list[Task] = []
        self.epoch = 0
        self.position = 0
        self._order: np.ndarray = np.zeros(0, dtype=np.int64)

    def attach(self, tasks: Sequence[Task]) -> None:
        if not tasks:
            raise ValueError("the train split is empty (check data.* settings and the skipped-row warnings)")
        self.tasks = list(tasks)
        self._order = self._permutation(self.epoch)

    def _permutation(self, epoch: int) -> np.ndarray:
        # Derived from (seed, epoch) alone, so a resumed run sees exactly the same order.
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.tasks))

    def next_batch(self) -> list[tuple[Task, int]]:
        batch = []
        for _ in range(self.prompts_per_step):
            if self.position >= len(self._order):
                self.epoch += 1
                self.position = 0
                self._order = self._permutation(self.epoch)
            batch.append((self.tasks[int(self._order[self.position])], self.samples_per_prompt))
            self.position += 1
        return batch

    def update(self, uids: Sequence[str], rewards: Sequence[float]) -> dict[str, float]:
        return {}

    def take_reports(self, output_dir: Path) -> list[Path]:
        return []  # nothing to report: every task is treated alike

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        if self.tasks:
            self._order = self._permutation(self.epoch)
