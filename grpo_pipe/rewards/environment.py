"""`reward=environment`: the score an environment class gives each episode (its `reward()`), as TRL's environments
may own the reward. An episode without one (its environment failed, or defines no reward) gets `missing`, counted."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from grpo_pipe.types import RewardOutput, RolloutGroup


class EnvironmentReward:
    """`reward=environment`: the score an environment class gives each episode (its `reward()`).

    Args:
        missing: The reward of an episode its environment gave no reward (its environment failed, or defines none);
            counted.
        success_at: A reward at least this counts as solved (eval/accuracy); None: no accuracy is logged.
    """

    def __init__(self, missing: float = 0.0, success_at: float | None = None) -> None:
        self.missing = missing  # the value of an episode its environment gave no reward
        self.success_at = success_at  # a reward at least this counts as solved (eval/accuracy); None: no such notion

    def setup(self, model_path: Path, kv_dtype: torch.dtype) -> None:
        pass  # needs nothing from the model

    def __call__(self, groups: Sequence[RolloutGroup]) -> RewardOutput:
        given = [c.episode.environment_reward if c.episode is not None else None for g in groups for c in g.completions]
        values = [self.missing if value is None else value for value in given]
        correct = None if self.success_at is None else [v >= self.success_at for v in values]
        return RewardOutput(values=values, terms={"environment": list(values),
                                                  "missing": [float(v is None) for v in given]}, correct=correct)
