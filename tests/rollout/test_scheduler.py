"""The async loop's bookkeeping: interval math by hand, and the version order of a real run."""

import pytest
from mlflow.tracking import MlflowClient

from grpo_pipe.pipeline import JobContext, run
from grpo_pipe.rollout.scheduler import covered_seconds, overlap_seconds


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
    With 1, generation runs one version ahead: from step 2 on, step s trains on version s-2."""
    cfg = compose_cfg(["trainer.steps=4", f"rollout_scheduler.max_staleness={max_staleness}"])
    result = run(cfg, JobContext(output_dir=tmp_path, run_name="order"))
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    low = _history(client, result.run_id, "rollout/policy_version_min")
    high = _history(client, result.run_id, "rollout/policy_version_max")
    expected = [max(s - 1 - max_staleness, 0) for s in range(1, 5)]
    assert low == high == [float(v) for v in expected]
    assert _history(client, result.run_id, "policy/version") == [1.0, 2.0, 3.0, 4.0]
    assert max(_history(client, result.run_id, "async/staleness_max")) == max_staleness
    assert result.ledger.balanced() and result.ledger.trained == 4 * 4 and not result.ledger.dropped
