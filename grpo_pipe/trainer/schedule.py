"""Learning-rate schedules: `WarmupSchedule(name, warmup_steps)(optimizer, total_updates)`.

A thin wrapper over transformers' schedules (imported only when a run builds one), so the yaml names
what it sets (`name`, `warmup_steps`) and the trainer supplies what only it knows (its optimizer and
how many updates the run makes: `trainer.steps x trainer.optimisation.updates_per_batch`).
"""

from __future__ import annotations

from typing import Any, Literal, get_args

import torch

from grpo_pipe.config.errors import failed

ScheduleName = Literal["constant", "constant_with_warmup", "linear", "cosine"]


class WarmupSchedule:
    """A learning-rate schedule, called by the trainer with its optimizer and the run's number of updates.

    Args:
        name: `constant`, `constant_with_warmup`, `linear` (decay to 0) or `cosine`, as transformers names them.
        warmup_steps: Optimizer updates over which the LR rises from 0 to `trainer.optimisation.lr`.
    """

    def __init__(self, *, name: ScheduleName = "constant_with_warmup", warmup_steps: int = 0) -> None:
        self.name = name
        self.warmup_steps = warmup_steps  # counts optimizer updates

    def config_problems(self) -> list[str]:
        return failed(
            (self.warmup_steps >= 0, f"trainer.optimisation.lr_schedule.warmup_steps={self.warmup_steps}: must be >= 0"),
            (self.name in get_args(ScheduleName),
             f"trainer.optimisation.lr_schedule.name={self.name!r}: allowed: {', '.join(get_args(ScheduleName))}"),
        )

    def __call__(self, optimizer: torch.optim.Optimizer, total_updates: int) -> Any:
        """An LR scheduler stepping once per optimizer update."""
        from transformers import get_scheduler

        return get_scheduler(self.name, optimizer, num_warmup_steps=self.warmup_steps, num_training_steps=total_updates)
