"""How a job ends: the outcome is recorded before the engine is released, within the grace a stop leaves."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from grpo_pipe.runner.pipeline import JobContext, _finish, run_name
from grpo_pipe.runner.recipe import GRPORecipe
from grpo_pipe.runtime.stopping import StopRequest


class _Ending:
    """Stands in for the tracker, the recipe and the stop request at once, recording the order of the calls."""

    def __init__(self, remaining_s: float | None, close_fails: bool = False) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self._remaining_s = remaining_s
        self._close_fails = close_fails

    def remaining_s(self) -> float | None:
        return self._remaining_s

    def close(self, status: str = "FINISHED", within_s: float | None = None) -> None:
        self.calls.append(("close", status, within_s))
        if self._close_fails:
            raise OSError("the tracking store is read-only")

    def set_tags(self, tags: dict[str, str]) -> None:
        self.calls.append(("set_tags", tags))

    def cleanup(self) -> None:
        self.calls.append(("cleanup",))

    def finish(self, status: str, reason: str = "") -> None:
        _finish(cast(Any, self), cast(GRPORecipe, self), status, cast(StopRequest, self), reason)


def test_a_finished_run_is_recorded_then_releases_the_engine_with_the_trackers_own_wait() -> None:
    ending = _Ending(remaining_s=None)  # no stop under way: no deadline
    ending.finish("FINISHED")
    assert ending.calls == [("close", "FINISHED", None), ("cleanup",)]


def test_a_stopped_run_is_marked_killed_first_and_the_tracker_waits_at_most_half_the_grace_left() -> None:
    ending = _Ending(remaining_s=12.0)
    ending.finish("KILLED")
    assert ending.calls == [("close", "KILLED", 6.0), ("cleanup",)]


def test_the_engine_is_released_even_when_recording_the_outcome_fails() -> None:
    ending = _Ending(remaining_s=None, close_fails=True)
    with pytest.raises(OSError, match="read-only"):
        ending.finish("FAILED")
    assert ending.calls == [("close", "FAILED", None), ("cleanup",)]


def test_a_failed_runs_reason_is_recorded_before_the_engine_and_trainer_shut_down() -> None:
    ending = _Ending(remaining_s=None)
    ending.finish("FAILED", reason="TimeoutError: engine did not finish the weight transfer within 120s")
    assert ending.calls == [
        ("set_tags", {"grpo_pipe.error": "TimeoutError: engine did not finish the weight transfer within 120s"}),
        ("close", "FAILED", None),
        ("cleanup",),
    ]


def test_a_named_experiments_sweep_children_keep_what_differs_in_their_names() -> None:
    child = JobContext(output_dir=Path("out/0"), run_name="weight_bridge=ipc,rollout_scheduler.max_staleness=1", sweep_dir="out")
    single = JobContext(output_dir=Path("out"), run_name="trainer.optimisation.lr=1e-5")
    assert run_name("calculator", child) == "calculator: weight_bridge=ipc,rollout_scheduler.max_staleness=1"
    assert run_name(None, child) == "weight_bridge=ipc,rollout_scheduler.max_staleness=1"
    assert run_name("calculator", single) == "calculator" and run_name("", single) == "trainer.optimisation.lr=1e-5"
