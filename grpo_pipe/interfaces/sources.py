"""The data side: where models, tasks and prompts come from, and the curriculum that picks them."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from grpo_pipe.interfaces.engines import RolloutEngine
from grpo_pipe.interfaces.episodes import EpisodeRunner
from grpo_pipe.types import (
    Ledger,
    SamplingSettings,
    TakenBatch,
    Task,
)


@runtime_checkable
class ModelSource(Protocol):
    """Where the policy's starting weights and its tokenizer come from."""

    def materialize(self) -> Path:
        """Return a local Hugging Face model folder (config, tokenizer, safetensors), building it if needed;
        the same folder on every call."""
        ...

    def tokenizer(self) -> Any:
        """The materialized model's tokenizer, loaded as every other loader of its folder loads it."""
        ...

    def copy_tokenizer(self, folder: Path) -> None:
        """Put the model's tokenizer files into `folder`, beside weights saved there, so it loads as a model."""
        ...


@runtime_checkable
class TaskSource(Protocol):
    """A dataset of tasks with a train/eval split that never overlap."""

    system_prompt: str
    max_bad_fraction: float  # the share of rows that may be skipped as unusable; more is an error

    @property
    def skipped(self) -> Collection[str]: ...  # "<file>:<line>: why" of each row that could not be used

    def train_tasks(self) -> Sequence[Task]: ...

    def eval_tasks(self) -> Sequence[Task]: ...


@runtime_checkable
class Curriculum(Protocol):
    """Chooses which tasks to roll out next and how many samples each gets."""

    def attach(self, tasks: Sequence[Task]) -> None:
        """The train split to choose from; called once, before the first `next_batch`."""
        ...

    def next_batch(self) -> list[tuple[Task, int]]: ...

    def update(self, uids: Sequence[str], rewards: Sequence[float]) -> Mapping[str, float]:
        """Record one step's per-completion rewards; return metrics to log."""
        ...

    def take_reports(self, output_dir: Path) -> list[Path]:
        """Write any report produced since the last call under `output_dir`; return the files written."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


@runtime_checkable
class ChecksTasks(Protocol):
    """A curriculum that needs something of every train task (a length in its metadata): checked on the loaded data
    beside the data's own problems, so a mismatch is one line of the one error list before the engine starts."""

    def task_problems(self, tasks: Sequence[Task]) -> list[str]:
        """One line per problem, naming the curriculum's setting; empty when fine."""
        ...


@runtime_checkable
class RolloutSource(Protocol):
    """Keeps the engine generating the batches the trainer takes next, within a staleness bound; every group
    it submits ends trained, dropped or in flight (`ledger`)."""

    max_staleness: int  # policy versions a trained sample may lag the trainer (0 = the synchronous loop)
    stale_policy: str  # pace (submit only within the bound) | drop (keep the engine busy, drop what is too old)
    ledger: Ledger
    generation_intervals: list[tuple[float, float]]  # wall-clock spans the engine was generating
    guard: Callable[[], Any]  # wraps every wait on the engine (a stop signal may abandon it)

    def fill(self, trainer_version: int, pushed_version: int, steps_done: int) -> int:
        """Submit batches while the bound allows; returns how many are in flight."""
        ...

    def take(self, trainer_version: int) -> TakenBatch:
        """The oldest batch in flight, waited for."""
        ...

    def requeue_lost(self) -> int:
        """After an engine restart: submit again what it lost; returns the batches re-issued."""
        ...

    def snapshot(self) -> dict[str, Any]: ...

    def restore(self, snapshot: Mapping[str, Any], tasks_by_uid: Mapping[str, Task]) -> None: ...


@runtime_checkable
class RolloutSourceFactory(Protocol):
    """The `rollout_scheduler` config group: typed settings (known, and checked, before the engine and the data exist)
    that build the recipe's source of batches once they do."""

    max_staleness: int  # policy versions a trained sample may lag the trainer (0 = the synchronous loop)
    stale_policy: str

    def build(
        self, engine: RolloutEngine, next_batch: Callable[[], list[tuple[Task, int]]],
        render: Callable[[Task], tuple[int, ...]], sampling: SamplingSettings, *, total_steps: int,
        prompt_limit: int | None, overlong_prompts: Literal["skip", "truncate"], episodes: EpisodeRunner,
    ) -> RolloutSource: ...


@runtime_checkable
class ReportsEvaluations(Protocol):
    """A source whose environments evaluate on their own (Atropos environments' `evaluate`): what they reported
    since the last call, as metrics for the step and files to keep with the run."""

    def take_evaluations(self) -> tuple[dict[str, float], list[Path]]: ...


@runtime_checkable
class ProvidesRollouts(Protocol):
    """An environment that brings its own training groups (`environment=atropos`: services that sample through the
    run's endpoint and score): the recipe takes its batches from this source instead of the rollout scheduler."""

    def rollout_source(self, engine: RolloutEngine, sampling: SamplingSettings, *, max_staleness: int,
                       total_steps: int, log_dir: Path) -> RolloutSource: ...
