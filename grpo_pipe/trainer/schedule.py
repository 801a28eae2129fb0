"""Learning-rate schedules, built as `_partial_` components: `schedule(optimizer, total_updates)`.

A thin wrapper over transformers' schedules (imported only when a run builds one), so the yaml names
what it sets (`name`, `warmup_steps`) and the trainer supplies what only it knows (its optimizer and
how many updates the run makes: `trainer.steps x trainer.updates_per_batch`).
"""

from __future__ import annotations

from typing import Any, Literal

import torch

from grpo_pipe.config.errors import ConfigError

ScheduleName = Literal["constant", "constant_with_warmup", "linear", "cosine"]


def warmup_schedule(
    optimizer: torch.optim.Optimizer,
    total_updates: int,
    name: ScheduleName = "constant_with_warmup",
    warmup_steps: int = 0,
) -> Any:
    """An LR scheduler stepping once per optimizer update; `warmup_steps` counts updates."""
    from transformers import get_scheduler

    if warmup_steps < 0:
        raise ConfigError([f"warmup_steps={warmup_steps}: must be >= 0"])
    return get_scheduler(name, optimizer, num_warmup_steps=warmup_steps, num_training_steps=total_updates)
