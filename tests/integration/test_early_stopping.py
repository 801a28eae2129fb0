"""Held-out evaluation every few steps; the run stops after `patience` evaluations without a new best."""

from mlflow.tracking import MlflowClient

from grpo_pipe.runner.pipeline import JobContext, run


def test_no_improvement_stops_the_run_and_keeps_a_checkpoint(compose_cfg, tmp_path) -> None:
    # The tiny random model answers nothing right: accuracy stays at its first value, never a new best.
    cfg = compose_cfg(["trainer.steps=6", "run.eval_every=1", "run.early_stop_patience=2"])
    result = run(cfg, JobContext(output_dir=tmp_path, run_name="early"))
    assert len(result.rewards) == 2  # evaluations after steps 1 and 2 did not beat step 0's
    assert result.summary["summary/early_stopped_at"] == 2.0
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    evals = sorted((m.step, m.value) for m in client.get_metric_history(result.run_id, "eval/accuracy"))
    assert [s for s, _ in evals] == [0, 1, 2]
    assert client.get_run(result.run_id).info.status == "FINISHED"
    assert (tmp_path / "checkpoints" / "step-000002" / "trainer.pt").exists()


def test_time_budget_ends_the_run_normally_after_the_step_that_passes_it(compose_cfg, tmp_path) -> None:
    # A budget of 6 ms is spent by the first step: the run evaluates, checkpoints and finishes there.
    cfg = compose_cfg(["trainer.steps=5", "run.max_minutes=0.0001"])
    result = run(cfg, JobContext(output_dir=tmp_path, run_name="budget"))
    assert len(result.rewards) == 1
    assert result.stopped_by is None
    assert result.summary["summary/time_budget_stopped_at"] == 1.0
    assert "eval/accuracy" in result.final_eval
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    assert sorted(m.step for m in client.get_metric_history(result.run_id, "eval/accuracy")) == [0, 1]
    assert client.get_run(result.run_id).info.status == "FINISHED"
    assert (tmp_path / "checkpoints" / "step-000001" / "trainer.pt").exists()
