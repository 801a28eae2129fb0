"""`reward=weighted`: several rewards summed with weights, each logged raw and weighted.

    reward = Σ_name weight[name] · reward[name]

Terms logged per completion (`train/reward/<term>`): each reward's value under `<name>`, its own terms
under `<name>/<term>`, and its weighted contribution under `weighted/<name>`, so a sweep over weights
shows both what the policy does (raw) and how much each weight moves the total (weighted).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from grpo_pipe.interfaces import (  # run time: config validation reads the hints
    ChecksItsConfig,
    HasSourceFiles,
    Reward,
    TriesOnTasks,
    reads_request_timestamps,
)
from grpo_pipe.types import RewardOutput, RolloutGroup, Task


class WeightedReward:
    """A weighted sum of named rewards; success (accuracy, pass@k) is `success_from`'s.

    reward = Σ weight[name] · reward[name]; each is logged raw (`train/reward/<name>`) and weighted
    (`train/reward/weighted/<name>`).

    Args:
        rewards: The rewards by name.
        weights: Each reward's weight, under the same names.
        success_from: Whose notion of "solved" evaluation uses; None = the first reward that has one.
    """

    def __init__(
        self, rewards: Mapping[str, Reward], weights: Mapping[str, float], success_from: str | None = None
    ) -> None:
        self.rewards = dict(rewards)
        self.weights = {name: float(w) for name, w in weights.items()}
        # Whose notion of "solved" counts; None: the first reward (in config order) that has one.
        self.success_from = success_from

    def config_problems(self) -> list[str]:
        problems = []
        if not self.rewards:
            problems.append("rewards={}: give at least one reward")
        if set(self.weights) != set(self.rewards):
            problems.append(
                f"weights={self.weights}: need exactly one weight per reward; rewards: {', '.join(self.rewards)}"
            )
        if self.success_from is not None and self.success_from not in self.rewards:
            problems.append(f"success_from={self.success_from!r}: allowed: {', '.join(self.rewards)} or null")
        for name, reward in self.rewards.items():
            if isinstance(reward, ChecksItsConfig):
                problems += [f"rewards.{name}.{p}" for p in reward.config_problems()]
        return problems

    def try_on(self, tasks: Sequence[Task]) -> list[str]:
        """Each part that runs user code, tried on `tasks` (see `TriesOnTasks`)."""
        return [f"rewards.{name}.{problem}" for name, reward in self.rewards.items()
                if isinstance(reward, TriesOnTasks) for problem in reward.try_on(tasks)]

    def source_files(self) -> list[Path]:
        return [path for reward in self.rewards.values() if isinstance(reward, HasSourceFiles)
                for path in reward.source_files()]

    def reads_request_timestamps(self) -> bool:
        return any(reads_request_timestamps(reward) for reward in self.rewards.values())

    def setup(self, model_path: Path, kv_dtype: torch.dtype) -> None:
        for reward in self.rewards.values():
            reward.setup(model_path, kv_dtype)

    def __call__(self, groups: Sequence[RolloutGroup]) -> RewardOutput:
        outputs = {name: reward(groups) for name, reward in self.rewards.items()}
        count = sum(len(g.completions) for g in groups)
        values = [0.0] * count  # [N]
        terms: dict[str, list[float]] = {}
        for name, out in outputs.items():
            weighted = [self.weights[name] * v for v in out.values]
            values = [total + w for total, w in zip(values, weighted)]
            terms[name] = list(out.values)
            terms.update({f"{name}/{term}": list(v) for term, v in out.terms.items() if term != name})
            terms[f"weighted/{name}"] = weighted
        source = self._success_source(outputs)
        return RewardOutput(
            values=values,
            terms=terms,
            correct=None if source is None else source.correct,
            task_values=None if source is None else source.difficulty_signal,
        )

    def _success_source(self, outputs: Mapping[str, RewardOutput]) -> RewardOutput | None:
        if self.success_from is not None:
            return outputs[self.success_from]
        return next((out for out in outputs.values() if out.correct is not None), None)
