"""What a run keeps: checkpoints and the tracker, and the config self-check every component may offer."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from grpo_pipe.interfaces.training import ShardedState


@runtime_checkable
class CheckpointStore(Protocol):
    """Where whole training states and the best model so far are written."""

    best_metric: str | None  # the evaluation metric that picks the best model (higher is better)
    best_value: float | None

    def attach(self, output_dir: Path) -> None:
        """A new run: write under this run's output folder (or the configured directory)."""
        ...

    def resume_in(self, root: Path) -> None:
        """A resumed run: keep writing into the checkpoint folder it was resumed from."""
        ...

    def set_best(self, value: float | None) -> None:
        """The best value so far without an export (the untrained baseline, or a resumed run's)."""
        ...

    def due(self, step: int, last_step: int) -> bool: ...

    def save(self, step: int, trainer_state: Mapping[str, Any] | ShardedState, loop_state: Mapping[str, Any],
             config_yaml: str) -> Any:
        """Write one checkpoint atomically; returns it (with its `path`), or None when a failed write was
        only warned about (a failure that stops the run raises). `trainer_state`: the trainer's state, or a
        trainer whose ranks write their own shards."""
        ...

    def consider_best(self, metrics: Mapping[str, float], export: Callable[[Path], None]) -> bool:
        """Export a new `best/` through `export(folder)` if `metrics` beat the best so far."""
        ...

    def latest(self) -> Any:
        """The newest checkpoint written (with its `path`), or None."""
        ...


@runtime_checkable
class Tracker(Protocol):
    """Experiment tracking: params, metrics, artifacts."""

    run_id: str | None

    def start(
        self,
        run_name: str,
        tags: Mapping[str, str],
        sweep_dir: str | None = None,
        resume_run_id: str | None = None,
        output_dir: Path | None = None,
    ) -> None:
        """Open the run (or continue `resume_run_id`); `output_dir` is the job's folder, where a tracker may leave
        what it could not deliver."""
        ...

    def logged_steps(self, key: str) -> set[int]:
        """Steps already logged for `key` (empty for a new run)."""
        ...

    def log_params(self, params: Mapping[str, Any]) -> None: ...

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Must not wait on the network for long: a tracking server that is away cannot hold training up."""
        ...

    def set_tags(self, tags: Mapping[str, str]) -> None:
        """Run-level facts that change as the run goes (the last step logged, the last checkpoint)."""
        ...

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None: ...

    def log_table(self, rows: Sequence[Mapping[str, Any]], artifact_file: str) -> None: ...

    def describe(self) -> str:
        """A line telling a person where the run is and how to look at it."""
        ...

    def close(self, status: str = "FINISHED", within_s: float | None = None) -> None:
        """End the run with `status`. `within_s` (a stop with a deadline) bounds the wait for an absent server;
        what is still undelivered then must not be lost."""
        ...


@runtime_checkable
class ChecksItsConfig(Protocol):
    """A component that can tell, cheaply and before any model loads, whether its settings can work
    (a path that does not exist, a column a file lacks, a function that cannot be imported)."""

    def config_problems(self) -> list[str]:
        """One line per problem, naming the key (relative to the component: `path=...`), the value and
        what is allowed; empty when fine. The caller puts the component's own key in front."""
        ...
