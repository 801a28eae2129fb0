"""A tracker that records nothing, for runs where tracking is not wanted (`logger=none`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from grpo_pipe.types import TrackedRun


class NullTracker:
    """`logger=none`: records nothing. Takes no arguments."""

    run_id: str | None = None

    def start(self, run: TrackedRun) -> None:
        pass

    def set_tags(self, tags: Mapping[str, str]) -> None:
        pass

    def logged_steps(self, key: str) -> set[int]:
        return set()

    def log_params(self, params: Mapping[str, Any]) -> None:
        pass

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        pass

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        pass

    def log_table(self, rows: Sequence[Mapping[str, Any]], artifact_file: str) -> None:
        pass

    def describe(self) -> str:
        return "Tracking is off (logger=none)."

    def close(self, status: str = "FINISHED", within_s: float | None = None) -> None:
        pass
