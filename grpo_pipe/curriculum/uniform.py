"""Uniform curriculum: shuffled passes over the train split, a fixed group size for every prompt."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from grpo_pipe.config.errors import failed
from grpo_pipe.curriculum.passes import ShuffledPasses
from grpo_pipe.types import Task


class UniformCurriculum:
    """`curriculum=uniform`: shuffled passes over the train split; every prompt gets the same number of samples.

    Args:
        prompts_per_step: Prompts (groups) per step.
        samples_per_prompt: The GRPO group size.
        seed: The order of the shuffled passes (`run.seed` by default).
    """

    def __init__(self, prompts_per_step: int = 8, samples_per_prompt: int = 8, seed: int = 0) -> None:
        self.prompts_per_step = prompts_per_step
        self.samples_per_prompt = samples_per_prompt
        self.seed = seed
        self.passes = ShuffledPasses(seed)

    def config_problems(self) -> list[str]:
        return failed(
            (self.prompts_per_step >= 1, f"curriculum.prompts_per_step={self.prompts_per_step} must be >= 1"),
            (self.samples_per_prompt >= 2, f"curriculum.samples_per_prompt={self.samples_per_prompt} must be >= 2 "
                                           "(GRPO compares samples within a group)"),
        )

    def attach(self, tasks: Sequence[Task]) -> None:
        self.passes.attach(tasks)

    def next_batch(self) -> list[tuple[Task, int]]:
        return [(task, self.samples_per_prompt) for task in self.passes.take(self.prompts_per_step)]

    def update(self, uids: Sequence[str], rewards: Sequence[float]) -> dict[str, float]:
        return {}

    def take_reports(self, output_dir: Path) -> list[Path]:
        return []  # nothing to report: every task is treated alike

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.passes.pass_index, "position": self.passes.position}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.passes.restore(int(state["epoch"]), int(state["position"]))
