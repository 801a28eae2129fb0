"""Shuffled passes over the train split: the order every curriculum walks before it decides sample counts."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from grpo_pipe.types import Task


class ShuffledPasses:
    """Every task once per pass, in an order derived from (seed, pass) alone: a resumed run sees exactly
    the order the uninterrupted one would have.

    Args:
        seed: A number, or several (a curriculum's seed and a level: passes of their own per level).
    """

    def __init__(self, seed: int | tuple[int, ...]) -> None:
        self.seed = seed
        self.tasks: list[Task] = []
        self.pass_index = 0
        self.position = 0  # tasks of the current pass already taken
        self._order: np.ndarray = np.zeros(0, dtype=np.int64)

    def attach(self, tasks: Sequence[Task]) -> None:
        if not tasks:
            raise ValueError("no tasks to take passes over (the job reports an empty train split before this)")
        self.tasks = list(tasks)
        self._order = self._permutation()

    def take(self, count: int) -> list[Task]:
        taken = []
        for _ in range(count):
            if self.position >= len(self._order):
                self.pass_index += 1
                self.position = 0
                self._order = self._permutation()
            taken.append(self.tasks[int(self._order[self.position])])
            self.position += 1
        return taken

    def restore(self, pass_index: int, position: int) -> None:
        self.pass_index, self.position = pass_index, position
        if self.tasks:
            self._order = self._permutation()

    def _permutation(self) -> np.ndarray:
        seeds = list(self.seed) if isinstance(self.seed, tuple) else [self.seed]
        return np.random.default_rng([*seeds, self.pass_index]).permutation(len(self.tasks))
