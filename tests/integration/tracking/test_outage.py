"""The tracking server goes away mid-run: a real `mlflow server` (sqlite backend) on 127.0.0.1, a real job logging to
it over HTTP, the server stopped and started again on the same port and store while the job trains. Training goes
on, the job warns once when the server goes and once when it is back, and afterwards every step's metrics are in
MLflow exactly once. When the server does not come back before the run ends, the job still ends normally, leaves
its undelivered records in its folder, and the upload command delivers them once the server answers; the same
when the job is killed outright mid-outage (the folder's file is then the outage's journal).

No timing window is relied on: the job is held at the start of a step's generation (`GRPO_PIPE_HALT_AT`) while the
test stops or starts the server, and the end of the run waits for a server that is coming back."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from grpo_pipe.types import TrackedRun
from tests.conftest import REPO, TINY
from tests.mlflow_server import Server

STEPS = 4  # held at the start of steps 2 and 4: two steps train during an outage, one after it
BASE = [o for o in TINY if not o.startswith(("trainer.steps", "run.eval_size"))] + [
    f"trainer.steps={STEPS}", "run.eval_size=2", "logger.system_metrics=false", "logger.retry_max_s=2",
]
KEYS = ("policy/version", "train/loss", "train/reward/mean", "Headline/reward")


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server for the module's tests (a start takes ~20-35 s); tests/conftest.py keeps them on one worker."""
    found = Server(tmp_path_factory.mktemp("server"))
    found.start()
    try:
        yield found
    finally:
        found.stop()


@pytest.fixture
def server(shared_server: Server) -> Server:
    """The shared server, answering when the test begins; each test stops and starts it as its outage needs. Runs in
    its one store are told apart by their output folder (or run id), never by being the only run there."""
    if shared_server.proc is None:  # a test before this one ended while the server was away
        shared_server.start()
    return shared_server


class Job:
    """The job in a subprocess, held at chosen points: `wait_halted` returns when it is held, `release` lets go."""

    def __init__(self, tmp_path: Path, uri: str, halts: str, *extra: str) -> None:
        self.run_dir, self.marker, self.out = tmp_path / "run", tmp_path / "halted", tmp_path / "job.log"
        env = {**os.environ, "COLUMNS": "1000", "GRPO_PIPE_HALT_AT": halts, "GRPO_PIPE_HALT_MARKER": str(self.marker)}
        with self.out.open("w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "grpo_pipe", *BASE, f"hydra.run.dir={self.run_dir}",
                 f"logger.tracking_uri={uri}", *extra],
                cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env,
            )

    def wait_halted(self, point: str) -> None:
        deadline = time.monotonic() + 600
        while not (self.marker.exists() and self.marker.read_text().strip() == point):
            assert self.proc.poll() is None, f"the job ended before {point}:\n{self.log()[-3000:]}"
            assert time.monotonic() < deadline, f"the job did not reach {point}"
            time.sleep(0.1)

    def release(self) -> None:
        self.marker.unlink()

    def finish(self) -> str:
        self.proc.wait(timeout=900)
        assert self.proc.returncode == 0, self.log()[-4000:]
        return self.log()

    def log(self) -> str:
        return self.out.read_text()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _the_run(uri: str, run_dir: Path):
    client = MlflowClient(tracking_uri=uri)
    [run] = client.search_runs([client.get_experiment_by_name("grpo_pipe").experiment_id],
                               filter_string=f"tags.`grpo_pipe.output_dir` = '{run_dir}'")
    return client, run


def _assert_every_step_once(uri: str, run_dir: Path) -> None:
    client, run = _the_run(uri, run_dir)
    for key in KEYS:
        steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, key))
        assert steps == list(range(1, STEPS + 1)), (key, steps)
    assert run.info.status == "FINISHED"
    assert run.data.tags["grpo_pipe.last_step"] == str(STEPS)
    assert "eval/accuracy" in run.data.metrics  # the final evaluation, logged at the end of the run


def test_the_server_goes_away_and_comes_back_mid_run_and_no_metric_is_lost(server: Server, tmp_path: Path) -> None:
    job = Job(tmp_path, server.uri, "generation@2,generation@4", "logger.flush_timeout_s=600")
    try:
        job.wait_halted("generation@2")  # step 1 done and handed to the tracker
        server.stop()
        job.release()  # steps 2 and 3 train while nothing answers
        job.wait_halted("generation@4")
        server.start()  # the same port and store
        job.release()
        out = job.finish()
    finally:
        job.kill()
    assert out.count("does not answer") == 1, out[-4000:]
    assert out.count("answers again") == 1 and "delivered late, none lost" in out
    assert not (job.run_dir / "mlflow_pending.jsonl").exists()
    _assert_every_step_once(server.uri, job.run_dir)


def test_a_server_that_never_comes_back_leaves_a_file_the_upload_command_delivers(server: Server, tmp_path: Path) -> None:
    job = Job(tmp_path, server.uri, "generation@2", "logger.flush_timeout_s=5")
    try:
        job.wait_halted("generation@2")
        server.stop()
        job.release()
        out = job.finish()  # the run ends normally
    finally:
        job.kill()
    pending = job.run_dir / "mlflow_pending.jsonl"
    assert pending.is_file() and "does not answer" in out
    assert f"python -m grpo_pipe.tracking.upload {pending}" in out  # the command to run later

    server.start()
    upload = [sys.executable, "-m", "grpo_pipe.tracking.upload", str(pending)]
    done = subprocess.run(upload, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    again = subprocess.run(upload, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert again.returncode == 2 and "uploaded" in again.stderr  # nothing sent twice
    _assert_every_step_once(server.uri, job.run_dir)


def test_a_job_killed_outright_during_an_outage_leaves_a_journal_the_upload_command_delivers(
    server: Server, tmp_path: Path
) -> None:
    """SIGKILL (the kernel's OOM killer) while the server is away: nothing the job logged is lost."""
    job = Job(tmp_path, server.uri, "generation@2,generation@4")
    try:
        job.wait_halted("generation@2")  # step 1 delivered
        server.stop()
        job.release()  # steps 2 and 3 train while nothing answers
        job.wait_halted("generation@4")
        deadline = time.monotonic() + 300
        while "does not answer" not in job.log():  # the outage was noticed (and the journal opened)
            assert time.monotonic() < deadline, job.log()[-3000:]
            time.sleep(0.1)
        job.proc.kill()  # no handler runs, no buffer is flushed
        job.proc.wait()
    finally:
        job.kill()
    journal = job.run_dir / "mlflow_pending.jsonl"
    assert f"python -m grpo_pipe.tracking.upload {journal}" in job.log()  # said when the outage began

    server.start()
    done = subprocess.run([sys.executable, "-m", "grpo_pipe.tracking.upload", str(journal)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    client, run = _the_run(server.uri, job.run_dir)
    for key in KEYS:
        assert sorted(m.step for m in client.get_metric_history(run.info.run_id, key)) == [1, 2, 3], key
    assert run.data.tags["grpo_pipe.last_step"] == "3"  # where it stopped
    assert run.info.status == "RUNNING"  # killed: nobody ended the run


def test_a_server_that_does_not_answer_at_the_start_is_one_error_before_anything_loads(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens there
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "grpo_pipe", *BASE, f"hydra.run.dir={tmp_path}/run",
         f"logger.tracking_uri=http://127.0.0.1:{port}"],
        cwd=REPO, capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "1000"},
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert f"logger.tracking_uri=http://127.0.0.1:{port}: the tracking server does not answer" in out
    assert "Invalid input:" in out and "Traceback" not in out  # not a rule on the config: the server it names
    checkpoints = tmp_path / "run" / "checkpoints"
    assert "Before training" not in out and not (checkpoints.exists() and any(checkpoints.iterdir()))
    assert time.monotonic() - started < 120


def test_a_stop_bounds_the_wait_for_an_absent_server_and_loses_no_record(server: Server, tmp_path: Path) -> None:
    """A stop leaves the tracker part of the grace (`close(within_s=...)`), shorter than `flush_timeout_s`: the run's
    records, its KILLED status included, go to the job's folder within it, and the upload command delivers them."""
    from grpo_pipe.tracking.mlflow_tracker import MlflowTracker

    tracker = MlflowTracker(tracking_uri=server.uri, system_metrics=False, retry_max_s=1, flush_timeout_s=600)
    tracker.start(TrackedRun(name="stopped", tags={}, output_dir=tmp_path))
    tracker.log_metrics({"train/loss": 0.5}, step=1)
    server.stop()
    tracker.log_metrics({"train/loss": 0.25}, step=2)
    asked = time.monotonic()
    tracker.close("KILLED", within_s=3.0)
    assert time.monotonic() - asked < 120.0  # the stop's bound (3 s, then the last try ends), far below 600 s
    pending = tmp_path / "mlflow_pending.jsonl"
    assert pending.is_file()

    server.start()
    done = subprocess.run([sys.executable, "-m", "grpo_pipe.tracking.upload", str(pending)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    client = MlflowClient(tracking_uri=server.uri)
    run = client.get_run(str(tracker.run_id))
    assert run.info.status == "KILLED"
    assert [m.value for m in client.get_metric_history(run.info.run_id, "train/loss")] == [0.5, 0.25]
