"""Length ladder (`curriculum=length_ladder`): the shortest tasks first; a longer length joins when the longest one
sampled so far is passed often enough.

Tasks are sorted into levels by a number in their metadata (`key`; `data=arithmetic` says each task's `operations`).
The run starts on the lowest level alone. After each step, each level's pass rate (the share of its completions
whose reward reaches `solved_at`) is smoothed by an EMA; when the highest unlocked level's EMA reaches `advance_at`,
after at least `min_prompts` of its prompts, the next level joins. The unlocked levels then share every batch in
equal parts (in turn, no draw), each level's tasks taken in shuffled passes of their own; with every level unlocked
the batches are those of uniform sampling over lengths (`curriculum=uniform` on tasks made in equal shares per length,
the contrast to sweep it against). A level never locks again. Every group has `samples_per_prompt` samples.

How it departs from a fixed schedule (a step count per length): the move is earned by measured pass rates, so a task a
model finds easy is left early and a hard one held until it is learned; and earlier lengths stay in the batch (no
forgetting of the short ones while the long ones are learned).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from grpo_pipe.config.errors import failed
from grpo_pipe.curriculum.passes import ShuffledPasses
from grpo_pipe.types import Task

log = logging.getLogger(__name__)


class LengthLadderCurriculum:
    """Short tasks first, longer ones as the shorter are passed.

    Args:
        prompts_per_step: prompts (groups) per step, shared equally by the unlocked levels.
        samples_per_prompt: the GRPO group size.
        key: the task metadata key whose number is the task's level (its length).
        solved_at: a completion whose reward is at least this counts as passed.
        advance_at: the highest unlocked level's smoothed pass rate at which the next level joins.
        min_prompts: prompts of the highest unlocked level needed before the next may join.
        ema_decay: weight of a level's pass-rate history against its latest step.
        seed: the order of each level's shuffled passes.
    """

    def __init__(
        self,
        *,
        prompts_per_step: int = 8,
        samples_per_prompt: int = 8,
        key: str = "operations",
        solved_at: float = 1.0,
        advance_at: float = 0.5,
        min_prompts: int = 64,
        ema_decay: float = 0.7,
        seed: int = 0,
    ) -> None:
        self.prompts_per_step, self.samples_per_prompt = prompts_per_step, samples_per_prompt
        self.key = key  # the metadata key of a task's level
        # when a completion passes, and when the next level joins
        self.solved_at, self.advance_at, self.min_prompts, self.ema_decay = solved_at, advance_at, min_prompts, ema_decay
        self.seed = seed
        self.levels: list[float] = []  # [L] the key's values, ascending
        self.passes: list[ShuffledPasses] = []  # [L] each level's tasks in shuffled passes
        self.level_of: dict[str, int] = {}  # task uid -> level index
        self.unlocked = 1  # levels 0 .. unlocked - 1 are sampled
        self.prompts_taken = 0  # prompts handed out in all: whose turn the next one is
        self.prompts_at_top = 0  # prompts of the highest unlocked level since it joined
        self.pass_rate: dict[int, float] = {}  # level index -> EMA of its pass rate

    def config_problems(self) -> list[str]:
        return failed(
            (self.prompts_per_step >= 1, f"curriculum.prompts_per_step={self.prompts_per_step} must be >= 1"),
            (self.samples_per_prompt >= 2, f"curriculum.samples_per_prompt={self.samples_per_prompt} must be >= 2 "
                                           "(GRPO compares samples within a group)"),
            (bool(self.key), "curriculum.key='': name the task metadata key that holds a task's length"),
            (0.0 < self.advance_at <= 1.0, f"curriculum.advance_at={self.advance_at} must be in (0, 1] (a pass rate)"),
            (self.min_prompts >= 1, f"curriculum.min_prompts={self.min_prompts} must be >= 1"),
            (0.0 <= self.ema_decay < 1.0, f"curriculum.ema_decay={self.ema_decay} must be in [0, 1)"),
        )

    def task_problems(self, tasks: Sequence[Task]) -> list[str]:
        """Tasks without a number under `key` have no place on the ladder (`data=arithmetic` gives `operations`)."""
        lacking = [t.uid for t in tasks if not _is_number(t.metadata.get(self.key))]
        if not lacking:
            return []
        named = ", ".join(lacking[:3]) + (f" and {len(lacking) - 3} more" if len(lacking) > 3 else "")
        return [f"key={self.key!r}: {len(lacking)} of {len(tasks)} train tasks have no number in metadata[{self.key!r}] "
                f"({named}); the ladder sorts tasks by it (data=arithmetic gives 'operations')"]

    def attach(self, tasks: Sequence[Task]) -> None:
        problems = self.task_problems(tasks)
        if problems:
            raise ValueError(problems[0])  # a run has reported them already, with the data's problems (ChecksTasks)
        self.levels = sorted({float(t.metadata[self.key]) for t in tasks})
        index = {value: i for i, value in enumerate(self.levels)}
        members: list[list[Task]] = [[] for _ in self.levels]
        for task in tasks:
            members[index[float(task.metadata[self.key])]].append(task)
            self.level_of[task.uid] = index[float(task.metadata[self.key])]
        self.passes = [ShuffledPasses((self.seed, level)) for level in range(len(self.levels))]
        for passes, level_tasks in zip(self.passes, members):
            passes.attach(level_tasks)

    def next_batch(self) -> list[tuple[Task, int]]:
        batch = []
        for _ in range(self.prompts_per_step):
            level = self.prompts_taken % self.unlocked  # the unlocked levels in turn
            batch.append((self.passes[level].take(1)[0], self.samples_per_prompt))
            self.prompts_taken += 1
            if level == self.unlocked - 1:
                self.prompts_at_top += 1
        return batch

    def update(self, uids: Sequence[str], rewards: Sequence[float]) -> dict[str, float]:
        """Fold this step's pass rate per level into its EMA; the next level joins when the top one is passed."""
        if len(uids) != len(rewards):
            raise ValueError(f"update got {len(uids)} uids but {len(rewards)} rewards")
        passed: dict[int, list[bool]] = {}
        for uid, reward in zip(uids, rewards):
            passed.setdefault(self.level_of[uid], []).append(reward >= self.solved_at)
        for level, flags in passed.items():
            rate = sum(flags) / len(flags)
            old = self.pass_rate.get(level)
            self.pass_rate[level] = rate if old is None else self.ema_decay * old + (1.0 - self.ema_decay) * rate
        self._climb()
        return {
            "curriculum/level": self.levels[self.unlocked - 1],  # the longest length sampled now
            "curriculum/unlocked": float(self.unlocked),
            **{f"curriculum/pass_rate/{self.key}_{self._name(level)}": rate
               for level, rate in sorted(self.pass_rate.items())},
        }

    def _climb(self) -> None:
        top = self.unlocked - 1
        if (self.unlocked < len(self.levels) and self.prompts_at_top >= self.min_prompts
                and self.pass_rate.get(top, 0.0) >= self.advance_at):
            self.unlocked += 1
            self.prompts_at_top = 0
            log.info("Curriculum: %s=%s joins (%s=%s passed at %.3f >= curriculum.advance_at=%s)", self.key,
                     self._name(top + 1), self.key, self._name(top), self.pass_rate[top], self.advance_at)

    def _name(self, level: int) -> str:
        value = self.levels[level]
        return str(int(value)) if value.is_integer() else str(value)

    def take_reports(self, output_dir: Path) -> list[Path]:
        return []  # the climb is in the metrics (curriculum/level, curriculum/pass_rate/*) and the log

    def state_dict(self) -> dict[str, Any]:
        return {
            "unlocked": self.unlocked,
            "prompts_taken": self.prompts_taken,
            "prompts_at_top": self.prompts_at_top,
            "pass_rate": {str(level): rate for level, rate in self.pass_rate.items()},
            "passes": [[p.pass_index, p.position] for p in self.passes],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.unlocked = int(state["unlocked"])
        self.prompts_taken = int(state["prompts_taken"])
        self.prompts_at_top = int(state["prompts_at_top"])
        self.pass_rate = {int(level): float(rate) for level, rate in state["pass_rate"].items()}
        for passes, (pass_index, position) in zip(self.passes, state["passes"]):
            passes.restore(int(pass_index), int(position))


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
