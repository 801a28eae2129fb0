"""Rewards, and the optional capabilities the recipe checks a reward for."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch

from grpo_pipe.types import (
    RewardOutput,
    RolloutGroup,
    Task,
)


@runtime_checkable
class Reward(Protocol):
    """Scores completions. Rewards compose: a composite reward holds others."""

    def setup(self, model_path: Path, kv_dtype: torch.dtype) -> None:
        """Called once the model is known (e.g. to read its dimensions); most rewards need nothing.

        Args:
            model_path: The materialized model folder (its `config.json` gives layers and heads).
            kv_dtype: The dtype of the engine's KV cache (what a cached token costs).
        """
        ...

    def __call__(self, groups: Sequence[RolloutGroup]) -> RewardOutput:
        """Return one value per completion, in group order then completion order.

        Args:
            groups: One group per task: its task (with the reference answer) and its completions.
        """
        ...


@runtime_checkable
class TriesOnTasks(Protocol):
    """A reward that runs user code: it is tried on a few rows of the data before the engine starts, so a
    broken function fails in seconds instead of after the engine's start-up."""

    def try_on(self, tasks: Sequence[Task]) -> list[str]:
        """One line per problem (naming the reward's key and what it raised); empty when fine.

        Args:
            tasks: A few rows of the data, each scored with a placeholder completion.
        """
        ...


@runtime_checkable
class HasSourceFiles(Protocol):
    """A component built from the user's own code: its files are logged with the run, so the run records what
    scored it."""

    def source_files(self) -> list[Path]: ...


@runtime_checkable
class ReadsRequestTimestamps(Protocol):
    """A reward that reads the engine's per-request timestamps (`RequestTelemetry.queued_s` ...). Engines
    record them only when some component reads them: recording costs decode speed."""

    def reads_request_timestamps(self) -> bool: ...


def reads_request_timestamps(reward: object) -> bool:
    """Whether `reward` reads per-request timestamps (a reward without the method reads none)."""
    return isinstance(reward, ReadsRequestTimestamps) and reward.reads_request_timestamps()


@runtime_checkable
class RecordsRequestTimestamps(Protocol):
    """An engine that records per-request timestamps on request; None = not decided by the config.

    Attributes:
        request_timestamps: Whether to record them; None: the runner decides (on when a reward reads them).
    """

    request_timestamps: bool | None
