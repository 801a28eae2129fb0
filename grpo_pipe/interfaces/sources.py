"""The data side: where models, tasks and prompts come from, and the curriculum that picks them."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from grpo_pipe.interfaces.engines import RolloutEngine
from grpo_pipe.interfaces.environments import Environment
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
        """Put the model's tokenizer files into `folder`, beside weights saved there, so it loads as a model.

        Args:
            folder: A folder the policy's weights were saved into (a checkpoint, a best-model export).
        """
        ...


@runtime_checkable
class TaskSource(Protocol):
    """A dataset of tasks with a train/eval split that never overlap.

    Attributes:
        system_prompt: The system message put first in every prompt.
        max_bad_fraction: The share of rows that may be skipped as unusable; more is an error.
    """

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
        """The train split to choose from; called once, before the first `next_batch`.

        Args:
            tasks: The data's train tasks.
        """
        ...

    def next_batch(self) -> list[tuple[Task, int]]:
        """The next step's tasks, each with how many completions it gets."""
        ...

    def update(self, uids: Sequence[str], rewards: Sequence[float]) -> Mapping[str, float]:
        """Record one step's per-completion rewards; return metrics to log.

        Args:
            uids: The task id of each completion, in the order of `rewards`.
            rewards: Each completion's reward, as the reward scored it.
        """
        ...

    def take_reports(self, output_dir: Path) -> list[Path]:
        """Write any report produced since the last call under `output_dir`; return the files written.

        Args:
            output_dir: The run's folder for reports (they are logged with the run).
        """
        ...

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs to choose as this one would have (plain data, with the checkpoint)."""
        ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from `state_dict`'s output.

        Args:
            state: What `state_dict` returned when the checkpoint was written.
        """
        ...


@runtime_checkable
class ChecksTasks(Protocol):
    """A curriculum that needs something of every train task (a length in its metadata): checked on the loaded data
    beside the data's own problems, so a mismatch is one line of the one error list before the engine starts."""

    def task_problems(self, tasks: Sequence[Task]) -> list[str]:
        """One line per problem, naming the curriculum's setting; empty when fine.

        Args:
            tasks: The loaded train tasks.
        """
        ...


@runtime_checkable
class RolloutSource(Protocol):
    """Keeps the engine generating the batches the trainer takes next, within a staleness bound; every group
    it submits ends trained, dropped or in flight (`ledger`).

    Attributes:
        max_staleness: Policy versions a trained sample may lag the trainer (0 = the synchronous loop).
        stale_policy: `pace` (submit only within the bound) or `drop` (keep the engine busy, drop what is too old).
        ledger: Every group submitted, counted as trained, dropped or in flight.
        generation_intervals: Wall-clock spans the engine was generating, since the step recorder last took them (it
            folds them into the run's overlap figures and empties the list, so no span is kept per step).
        guard: Wraps every wait on the engine (a stop signal may abandon it).
    """

    max_staleness: int  # policy versions a trained sample may lag the trainer (0 = the synchronous loop)
    stale_policy: str  # pace (submit only within the bound) | drop (keep the engine busy, drop what is too old)
    ledger: Ledger
    generation_intervals: list[tuple[float, float]]  # wall-clock spans the engine was generating
    guard: Callable[[], Any]  # wraps every wait on the engine (a stop signal may abandon it)

    def fill(self, trainer_version: int, pushed_version: int, steps_done: int) -> int:
        """Submit batches while the bound allows; returns how many are in flight.

        Args:
            trainer_version: The trainer's policy version now (the bound is measured from it).
            pushed_version: The version the engine serves (the last one pushed).
            steps_done: Steps trained so far: nothing is submitted for steps past the run's last.
        """
        ...

    def take(self, trainer_version: int) -> TakenBatch:
        """The oldest batch in flight, waited for.

        Args:
            trainer_version: The trainer's policy version now: samples older than the bound are dropped (`drop`).
        """
        ...

    def requeue_lost(self) -> int:
        """After an engine restart: submit again what it lost; returns the batches re-issued."""
        ...

    def snapshot(self) -> dict[str, Any]:
        """The batches in flight and the ledger as plain data, for a checkpoint."""
        ...

    def restore(self, snapshot: Mapping[str, Any], tasks_by_uid: Mapping[str, Task]) -> None:
        """Continue from a checkpoint's `snapshot` (batches in flight kept or dropped as configured).

        Args:
            snapshot: What `snapshot` returned when the checkpoint was written.
            tasks_by_uid: The data's tasks by id, to find the tasks of the batches in flight again.
        """
        ...


@runtime_checkable
class RolloutSourceFactory(Protocol):
    """The `rollout_scheduler` config group: typed settings (known, and checked, before the engine and the data exist)
    that build the recipe's source of batches once they do.

    Attributes:
        max_staleness: Policy versions a trained sample may lag the trainer (0 = the synchronous loop).
        stale_policy: `pace` (hold generation back so no sample exceeds the bound) or `drop` (discard and count them).
    """

    max_staleness: int  # policy versions a trained sample may lag the trainer (0 = the synchronous loop)
    stale_policy: str

    def build(
        self, engine: RolloutEngine, next_batch: Callable[[], list[tuple[Task, int]]],
        render: Callable[[Task], tuple[int, ...]], sampling: SamplingSettings, *, total_steps: int,
        prompt_limit: int | None, overlong_prompts: Literal["skip", "truncate"], environment: Environment,
    ) -> RolloutSource:
        """The recipe's source of batches, once the engine, the curriculum and the prompts exist.

        Args:
            engine: The engine batches are generated on.
            next_batch: The curriculum's `next_batch`: the tasks of the next batch to submit.
            render: A task's prompt token ids (the environment's `render_prompt`).
            sampling: The sampling settings of every generation.
            total_steps: The run's steps: nothing is generated for a step past them.
            prompt_limit: The most prompt tokens that leave room for a completion, or None for no limit.
            overlong_prompts: What happens to a longer prompt: `skip` its task, or `truncate` it.
            environment: The environment that turns each prompt into completions (one turn, or episodes with tools).
        """
        ...


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
                       total_steps: int, log_dir: Path) -> RolloutSource:
        """The source the recipe takes batches from in place of the rollout scheduler.

        Args:
            engine: The engine the environments sample through (behind the run's endpoint).
            sampling: The run's sampling settings, served to the environments' requests.
            max_staleness: Policy versions a trained group may lag the trainer (`rollout_scheduler.max_staleness`).
            total_steps: The run's steps.
            log_dir: The run's folder for the environment processes' logs.
        """
        ...
