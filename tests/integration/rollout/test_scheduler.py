"""The async loop's bookkeeping: interval math by hand, and the version order of a real run."""

import logging

import pytest
from mlflow.tracking import MlflowClient

from grpo_pipe.interfaces import RolloutSource
from grpo_pipe.rollout.scheduler import MAX_EMPTY_BATCHES, NoTaskFits, RolloutScheduler, covered_seconds, overlap_seconds
from grpo_pipe.runner.pipeline import JobContext, run
from grpo_pipe.types import Completion, GeneratedBatch, RequestTelemetry, SamplingSettings, Task


def test_covered_seconds_merges_overlapping_spans() -> None:
    assert covered_seconds([(0.0, 2.0), (1.0, 3.0), (5.0, 6.0)]) == pytest.approx(4.0)
    assert covered_seconds([(0.0, 4.0), (1.0, 2.0)]) == pytest.approx(4.0)
    assert covered_seconds([]) == 0.0


def test_overlap_seconds_counts_time_covered_by_both() -> None:
    training = [(0.0, 2.0), (4.0, 6.0)]
    generation = [(1.0, 5.0)]
    assert overlap_seconds(training, generation) == pytest.approx(2.0)  # [1,2) and [4,5)
    assert overlap_seconds(training, [(2.0, 4.0)]) == 0.0


def _history(client: MlflowClient, run_id: str, key: str) -> list[float]:
    return [m.value for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)]


@pytest.mark.parametrize("max_staleness", [0, 1])
def test_generation_order_follows_the_staleness_bound(compose_cfg, tmp_path, max_staleness: int) -> None:
    """max_staleness=0 is the synchronous loop: step s trains on samples of version s-1 exactly.
    With 1, generation may run one version ahead: step s trains on version s-2 or s-1 (which one depends
    on whether the engine began the batch before the next push: timing, so only the bound is asserted)."""
    cfg = compose_cfg(["trainer.steps=4", f"rollout_scheduler.max_staleness={max_staleness}"])
    result = run(cfg, JobContext(output_dir=tmp_path, run_name="order"))
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    low = _history(client, result.run_id, "rollout/policy_version_min")
    high = _history(client, result.run_id, "rollout/policy_version_max")
    assert all(max(s - 1 - max_staleness, 0) <= v <= s - 1 for s, v in enumerate(low, start=1)), low
    assert low == sorted(low) and all(lo <= hi <= s - 1 for s, (lo, hi) in enumerate(zip(low, high), start=1))
    if max_staleness == 0:
        assert low == high == [0.0, 1.0, 2.0, 3.0]  # synchronous: no race, exactly the previous version
    assert _history(client, result.run_id, "policy/version") == [1.0, 2.0, 3.0, 4.0]
    if max_staleness == 0:  # the synchronous loop logs no async/* charts of zeros
        assert not [k for k in client.get_run(result.run_id).data.metrics if k.startswith("async/")]
    else:
        assert max(_history(client, result.run_id, "async/staleness_max")) <= max_staleness
        assert _history(client, result.run_id, "async/queue_depth")[0] == 1.0 + max_staleness  # ran ahead by the pace rule
    assert result.ledger.balanced() and result.ledger.trained == 4 * 4 and not result.ledger.dropped


class _EchoEngine:
    """An in-memory RolloutEngine: one fixed completion per sample, generated at once."""

    served_version = 0

    def submit(self, prompts, samples, sampling) -> GeneratedBatch:
        telemetry = RequestTelemetry(prompt_tokens=1, generated_tokens=1, cached_prompt_tokens=0)
        done = Completion(token_ids=(7,), logprobs=(-0.5,), text="7", finish_reason="stop", policy_version=0, telemetry=telemetry)
        return GeneratedBatch([[done] * n for n in samples], 0.0, 0.0)


def _scheduler(question_lengths: list[int], limit: int) -> RolloutScheduler:
    tasks = [Task(uid=f"t{i}", question="x" * n, answer="1") for i, n in enumerate(question_lengths)]
    draws = iter(range(10_000))

    def next_batch() -> list[tuple[Task, int]]:
        start = next(draws) * 4
        return [(tasks[(start + i) % len(tasks)], 2) for i in range(4)]

    return RolloutScheduler(
        engine=_EchoEngine(), next_batch=next_batch, render=lambda task: tuple(range(len(task.question))),
        sampling=SamplingSettings(max_tokens=4),
        total_steps=10, max_staleness=0, stale_policy="pace", prompt_limit=limit,
    )


def test_the_scheduler_is_the_rollout_source_the_recipe_types_it_as() -> None:
    assert isinstance(_scheduler([5, 6], limit=10), RolloutSource)


def test_a_step_where_no_prompt_fits_is_an_error_with_one_warning_per_batch(caplog) -> None:
    scheduler = _scheduler([50, 60, 70, 80, 90], limit=10)
    with caplog.at_level(logging.WARNING), pytest.raises(NoTaskFits, match="run.max_new_tokens"):
        scheduler.fill(0, 0, steps_done=0)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == MAX_EMPTY_BATCHES  # one summarised line per batch, not one per task
    assert "4 of 4 task(s) skipped" in warnings[0].getMessage() and "t0 (50 tokens)" in warnings[0].getMessage()
    assert scheduler.ledger.dropped == {"prompt longer than 10 tokens": 4 * MAX_EMPTY_BATCHES}


def test_prompts_that_fit_are_rolled_out_and_the_rest_counted(caplog) -> None:
    scheduler = _scheduler([5, 50, 6, 7], limit=10)
    with caplog.at_level(logging.WARNING):
        scheduler.fill(0, 0, steps_done=0)
        taken = scheduler.take(0)
    assert [g.task.uid for g in taken.groups] == ["t0", "t2", "t3"]
    assert scheduler.ledger.dropped == {"prompt longer than 10 tokens": 1} and scheduler.ledger.balanced()
    assert caplog.text.count("skipped, prompt longer than") == 1
