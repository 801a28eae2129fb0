"""The settings of the run itself (`run.*`): what the recipe needs beyond its components."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class RunSettings:
    """Settings of the run itself (`run.*`)."""

    name: str | None = None  # MLflow run name; None = this job's overrides
    seed: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 96
    eval_every: int = 0
    eval_size: int = 64
    eval_max_new_tokens: int = 96
    early_stop_patience: int = 0  # stop after this many evaluations without a new best; 0 = never
    max_minutes: float | None = None  # time budget for the training loop: the run ends normally after the step that passes it
    overlong_prompts: Literal["skip", "truncate"] = "skip"  # prompts that leave no room for max_new_tokens
    samples_to_log: int = 16
    seeded_sampling: bool = True  # every batch sampled with a seed derived from `seed`: reproducible, resumable
