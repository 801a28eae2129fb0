"""What a run keeps: checkpoints and the tracker, and the config self-check every component may offer."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from grpo_pipe.interfaces.training import ShardedState
from grpo_pipe.types import TrackedRun


@runtime_checkable
class CheckpointStore(Protocol):
    """Where whole training states and the best model so far are written.

    Attributes:
        best_metric: The evaluation metric that picks the best model (higher is better); None: no `best/` export.
        best_value: Its best value so far, or None before the first evaluation.
    """

    best_metric: str | None  # the evaluation metric that picks the best model (higher is better)
    best_value: float | None

    def attach(self, output_dir: Path) -> None:
        """A new run: write under this run's output folder (or the configured directory).

        Args:
            output_dir: The run's output folder.
        """
        ...

    def resume_in(self, root: Path) -> None:
        """A resumed run: keep writing into the checkpoint folder it was resumed from.

        Args:
            root: The folder holding the checkpoint the run resumed from.
        """
        ...

    def set_best(self, value: float | None) -> None:
        """The best value so far without an export (the untrained baseline, or a resumed run's).

        Args:
            value: The best metric value so far, or None for none yet.
        """
        ...

    def due(self, step: int, last_step: int) -> bool:
        """Whether a checkpoint is written after `step`.

        Args:
            step: The step just trained.
            last_step: The run's last step (a run always saves at its end).
        """
        ...

    def save(self, step: int, trainer_state: Mapping[str, Any] | ShardedState, loop_state: Mapping[str, Any],
             config_yaml: str) -> Any:
        """Write one checkpoint atomically; returns it (with its `path`), or None when a failed write was
        only warned about (a failure that stops the run raises).

        Args:
            step: The step the state is after.
            trainer_state: The trainer's state, or a trainer whose ranks write their own shards.
            loop_state: The recipe's own state beyond the trainer's (plain data, written as `loop.json`).
            config_yaml: The run's resolved config, written beside the state.
        """
        ...

    def consider_best(self, metrics: Mapping[str, float], export: Callable[[Path], None]) -> bool:
        """Export a new `best/` through `export(folder)` if `metrics` beat the best so far.

        Args:
            metrics: A held-out evaluation's metrics; `best_metric` is read from them.
            export: Writes the model into the folder it is given (the policy's `save_pretrained`).
        """
        ...

    def latest(self) -> Any:
        """The newest checkpoint written (with its `path`), or None."""
        ...


@runtime_checkable
class Tracker(Protocol):
    """Experiment tracking: params, metrics, artifacts.

    Attributes:
        run_id: The tracker's id of the open run (what a resumed job continues), or None before `start`.
    """

    run_id: str | None

    def start(self, run: TrackedRun) -> None:
        """Open the run (or continue `run.resume_run_id`).

        Args:
            run: Its name and tags, the sweep it belongs to, the run it continues, the job's folder.
        """
        ...

    def logged_steps(self, key: str) -> set[int]:
        """Steps already logged for `key` (empty for a new run).

        Args:
            key: A metric key, e.g. `train/reward/mean`.
        """
        ...

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Record the run's settings once, at its start.

        Args:
            params: Flattened config keys and their values.
        """
        ...

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Must not wait on the network for long: a tracking server that is away cannot hold training up.

        Args:
            metrics: Metric values under `section/name/sub` keys.
            step: The training step they belong to.
        """
        ...

    def set_tags(self, tags: Mapping[str, str]) -> None:
        """Run-level facts that change as the run goes (the last step logged, the last checkpoint).

        Args:
            tags: Tag names and values, replacing earlier values of the same names.
        """
        ...

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        """Keep a file with the run (a report, a plot, the user's reward code).

        Args:
            path: The local file.
            artifact_path: The folder inside the run's artifacts, or None for the top.
        """
        ...

    def log_table(self, rows: Sequence[Mapping[str, Any]], artifact_file: str) -> None:
        """Keep a table with the run (e.g. sampled completions), one mapping per row.

        Args:
            rows: The rows, each mapping column names to values.
            artifact_file: The file name it is stored under in the run's artifacts.
        """
        ...

    def describe(self) -> str:
        """A line telling a person where the run is and how to look at it."""
        ...

    def close(self, status: str = "FINISHED", within_s: float | None = None) -> None:
        """End the run with `status`; what is still undelivered when `within_s` runs out must not be lost.

        Args:
            status: MLflow's run status: `FINISHED`, `FAILED` or `KILLED`.
            within_s: A stop with a deadline: bounds the wait for an absent server; None waits as usual.
        """
        ...


@runtime_checkable
class ChecksItsConfig(Protocol):
    """A component that can tell, cheaply and before any model loads, whether its settings can work
    (a path that does not exist, a column a file lacks, a function that cannot be imported)."""

    def config_problems(self) -> list[str]:
        """One line per problem, naming the key (relative to the component: `path=...`), the value and
        what is allowed; empty when fine. The caller puts the component's own key in front."""
        ...
