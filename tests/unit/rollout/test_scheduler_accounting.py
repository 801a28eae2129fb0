"""The scheduler's pace/drop accounting against an in-memory engine (unit tier)."""

from __future__ import annotations

from grpo_pipe.rollout.scheduler import RolloutScheduler
from grpo_pipe.types import SamplingSettings, Task
from tests.fakes import TASKS, FakeCurriculum, FakeEngine


def _scheduler(engine: FakeEngine, max_staleness: int, stale_policy: str) -> RolloutScheduler:
    curriculum = FakeCurriculum()
    curriculum.attach(TASKS)

    def render(task: Task) -> tuple[int, ...]:
        return tuple(ord(c) for c in task.question)

    return RolloutScheduler(engine=engine, next_batch=curriculum.next_batch, render=render,
                            sampling=SamplingSettings(seed=0), total_steps=6,
                            max_staleness=max_staleness, stale_policy=stale_policy)  # type: ignore[arg-type]


def test_pace_never_submits_past_the_bound() -> None:
    scheduler = _scheduler(FakeEngine(), max_staleness=1, stale_policy="pace")
    # Trainer at v0, nothing pushed: v0 + queue - 0 <= 1 allows two batches in flight.
    assert scheduler.fill(trainer_version=0, pushed_version=0, steps_done=0) == 2
    assert scheduler.fill(trainer_version=1, pushed_version=0, steps_done=1) == 0  # 1 + 2 - 0 > 1
    taken = scheduler.take(trainer_version=1)
    assert taken.staleness == [1, 1] and not taken.dropped


def test_drop_discards_and_counts_groups_that_got_too_old() -> None:
    engine = FakeEngine()
    scheduler = _scheduler(engine, max_staleness=0, stale_policy="drop")
    assert scheduler.fill(trainer_version=0, pushed_version=0, steps_done=0) == 2  # max_staleness + 2 in flight
    taken = scheduler.take(trainer_version=1)  # generated on v0, trained at v1: one version too old
    assert taken.groups == [] and [lag for _, lag in taken.dropped] == [1, 1]
    ledger = scheduler.ledger
    assert ledger.dropped == {"staleness 1 > max_staleness 0": 2} and ledger.in_flight == 2 and ledger.balanced()


def test_the_last_batches_are_not_generated_past_the_run() -> None:
    scheduler = _scheduler(FakeEngine(), max_staleness=3, stale_policy="pace")
    assert scheduler.fill(trainer_version=5, pushed_version=5, steps_done=5) == 1  # one step left: one batch
