"""The scheduler's pace/drop accounting against an in-memory engine (unit tier)."""

from __future__ import annotations

import json

import pytest

from grpo_pipe.rollout.ledger import GroupRecord, ledger_metrics
from grpo_pipe.rollout.scheduler import DROPPED_AT_RESUME, RolloutScheduler, RolloutSchedulerSettings
from grpo_pipe.types import SamplingSettings, Task
from tests.fakes import TASKS, FakeCurriculum, FakeEngine


def _scheduler(engine: FakeEngine, max_staleness: int, stale_policy: str, in_flight_on_resume: str = "keep") -> RolloutScheduler:
    curriculum = FakeCurriculum()
    curriculum.attach(TASKS)

    def render(task: Task) -> tuple[int, ...]:
        return tuple(ord(c) for c in task.question)

    return RolloutScheduler(engine=engine, next_batch=curriculum.next_batch, render=render,
                            sampling=SamplingSettings(seed=0), total_steps=6,
                            max_staleness=max_staleness, stale_policy=stale_policy,  # type: ignore[arg-type]
                            in_flight_on_resume=in_flight_on_resume)  # type: ignore[arg-type]


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


def _step(scheduler: RolloutScheduler, engine: FakeEngine, step: int) -> None:
    """One step as the recipe runs it: fill, take, (update to v`step`, sync), fill again for what comes next."""
    scheduler.fill(trainer_version=step - 1, pushed_version=step - 1, steps_done=step - 1)
    scheduler.take(trainer_version=step - 1)
    engine.served_version = step
    scheduler.fill(trainer_version=step, pushed_version=step, steps_done=step)


def _checkpointed_mid_run() -> dict:
    """A scheduler one version ahead, checkpointed after step 2 with batches 3 and 4 in flight, as `loop.json` holds it."""
    engine = FakeEngine()
    scheduler = _scheduler(engine, max_staleness=1, stale_policy="pace")
    for step in (1, 2):
        _step(scheduler, engine, step)
    return json.loads(json.dumps(scheduler.snapshot()))


def _resumed(in_flight_on_resume: str) -> tuple[RolloutScheduler, FakeEngine]:
    engine = FakeEngine()
    engine.served_version = 2  # the resumed engine serves the checkpoint's weights
    resumed = _scheduler(engine, max_staleness=1, stale_policy="pace", in_flight_on_resume=in_flight_on_resume)
    resumed.restore(_checkpointed_mid_run(), {t.uid: t for t in TASKS})
    return resumed, engine


def test_kept_in_flight_groups_are_generated_again_and_trained_once_after_a_resume() -> None:
    assert _checkpointed_mid_run()["groups"] == {"1": "TT", "2": "TT", "3": "FF", "4": "FF"}
    resumed, engine = _resumed("keep")
    assert resumed.in_flight == 2 and resumed.ledger.balanced()
    for step in (3, 4, 5, 6):
        _step(resumed, engine, step)
    assert resumed.groups.state_dict() == {str(b): "TT" for b in range(1, 7)}
    assert ledger_metrics(resumed.ledger) == {"ledger/submitted": 12.0, "ledger/trained": 12.0, "ledger/dropped": 0.0,
                                              "ledger/in_flight": 0.0, "ledger/repeated": 0.0, "ledger/balanced": 1.0}


def test_dropped_in_flight_groups_are_counted_and_named_once_and_the_run_goes_on_with_new_batches(caplog) -> None:
    resumed, engine = _resumed("drop")
    assert resumed.in_flight == 0 and resumed.ledger.dropped == {DROPPED_AT_RESUME: 4} and resumed.ledger.balanced()
    assert [r.getMessage() for r in caplog.records if "dropped and counted" in r.getMessage()] == [
        "Resume: 4 group(s) of 2 batch(es) in flight at the checkpoint dropped and counted "
        "(rollout_scheduler.in_flight_on_resume=drop): batches 3, 4"]
    for step in (3, 4, 5, 6):
        _step(resumed, engine, step)
    assert resumed.groups.state_dict() == {"1": "TT", "2": "TT", "3": "DD", "4": "DD", **{str(b): "TT" for b in range(5, 9)}}
    assert resumed.ledger.balanced() and resumed.ledger.trained == 12


def test_a_group_trained_twice_is_counted_as_a_repeat_and_the_ledger_no_longer_balances() -> None:
    record = GroupRecord()
    assert record.submitted(1, 2) == 0 and record.submitted(1, 2) == 0  # re-issued while in flight: no repeat
    assert record.settled(1, ["T", "D"]) == 0
    assert record.settled(1, ["T", "T"]) == 2 and record.submitted(1, 2) == 2


@pytest.mark.parametrize("value", ["lose", ""])
def test_in_flight_on_resume_names_what_it_allows(value: str) -> None:
    assert RolloutSchedulerSettings(in_flight_on_resume=value).config_problems() == [  # type: ignore[arg-type]
        f"in_flight_on_resume={value!r}: allowed: 'keep', 'drop'"]
