"""Stop signals: a generation in progress is abandoned, the last finished step is checkpointed, the
process ends within `run.shutdown_grace_s`, and a second signal ends it at once. Real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from grpo_pipe.checkpoint.store import Checkpoint
from tests.conftest import REPO, TINY
from tests.processes import reaped, stop_with_sigterm

_SCRIPT = textwrap.dedent("""
    import os, signal, sys, time
    from grpo_pipe.runtime.stopping import GenerationInterrupted, StopRequest
    with StopRequest(grace_s=float(sys.argv[1])) as stop:
        try:
            with stop.interruptible():
                print("generating", stop.remaining_s(), flush=True)
                time.sleep(600)  # a generation that would run for ten minutes
        except GenerationInterrupted as err:
            print("abandoned", err, flush=True)
        print("stopping", stop.remaining_s(), flush=True)
        time.sleep(600)  # a stop that hangs (an engine that will not shut down)
""")


def _start(grace_s: float) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", _SCRIPT, str(grace_s)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "generating None"  # no deadline before a stop
    return proc


def test_the_first_signal_abandons_the_generation_and_the_grace_bounds_the_stop() -> None:
    proc = _start(grace_s=2.0)
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM
    abandoned, stopping = out.split("\n")[:2]
    assert abandoned == "abandoned SIGTERM"
    assert stopping.startswith("stopping ") and 0.0 < float(stopping.split()[1]) <= 2.0  # the grace left
    # Ended by the grace deadline, not by the ten-minute sleeps (the upper bound leaves a loaded machine a minute).
    assert 2.0 <= time.monotonic() - sent < 60.0


def test_a_second_signal_exits_at_once() -> None:
    proc = _start(grace_s=600.0)
    proc.send_signal(signal.SIGINT)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "abandoned SIGINT"
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM and time.monotonic() - sent < 60.0  # not the 600 s grace


def _wait_for_text(path: Path, text: str, proc: subprocess.Popen, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while not (path.exists() and text in path.read_text()):
        assert proc.poll() is None, f"the run ended before {text!r} was logged"
        assert time.monotonic() < deadline, f"{text!r} not logged in {path}"
        time.sleep(0.1)


@pytest.mark.parametrize("max_staleness", [0, 1], ids=["generating_in_the_loop", "generating_in_the_background"])
def test_sigterm_during_a_2000_token_generation_exits_within_the_grace_with_a_checkpoint(tmp_path, max_staleness) -> None:
    """Step 1 runs with a short budget; the resumed run's step 2 has a 2,000-token budget (minutes of
    generation for the tiny model on 2 CPU cores: measured 314 s for 16 samples) and is stopped. With
    max_staleness=1 the engine generates on its own thread while the loop waits for the batch: the wait is
    abandoned, and the generation with it when the engine shuts down."""
    grace = 20.0
    store = tmp_path / "mlflow.db"
    base = [
        *TINY, "model.max_position_embeddings=2560", "rollout.max_model_len=2560", f"logger.tracking_uri=sqlite:///{store}",
        f"logger.artifact_location={tmp_path}/artifacts", f"rollout_scheduler.max_staleness={max_staleness}",
        "checkpoint.every=1", f"run.shutdown_grace_s={grace}", "curriculum.prompts_per_step=2",
    ]
    env = {**os.environ, "COLUMNS": "200"}
    first = tmp_path / "first"
    done = subprocess.run([sys.executable, "-m", "grpo_pipe", *base, "trainer.steps=1", "run.max_new_tokens=16",
                           f"hydra.run.dir={first}"], cwd=REPO, capture_output=True, text=True, timeout=600, env=env,
                          check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    second = tmp_path / "second"
    proc = subprocess.Popen(
        [sys.executable, "-m", "grpo_pipe", *base, "trainer.steps=2", "run.max_new_tokens=2000", f"resume={first}",
         "resume_accept=[trainer.steps,run.max_new_tokens,loss.max_tokens,trainer.loss.max_tokens]", f"hydra.run.dir={second}"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )
    with reaped(proc):
        # The stop handler is in place once the engine is up; step 2's batch is being generated after this line.
        _wait_for_text(second / "grpo_pipe.log", "up to 2000 new tokens", proc)
        out, elapsed = stop_with_sigterm(proc, grace)
    assert proc.returncode == 128 + signal.SIGTERM, out[-3000:]
    assert elapsed < grace + 10, f"stop took {elapsed:.1f}s"
    assert "Stopped during step 2's generation (SIGTERM)" in out and "step 2/2" not in out
    [saved] = sorted((first / "checkpoints").glob("step-*"))  # one run, one checkpoint folder
    assert saved.name == "step-000001"
    state = Checkpoint(saved).trainer_state()  # loads with weights_only=True
    assert state["version"] == 1 and state["params"]
    client = MlflowClient(tracking_uri=f"sqlite:///{store}")
    [tracked] = client.search_runs([client.get_experiment_by_name("grpo_pipe").experiment_id])  # resumed: one run
    assert tracked.info.status == "KILLED"
    assert [m.step for m in client.get_metric_history(tracked.info.run_id, "policy/version")] == [1]


def test_sigterm_while_a_tool_hangs_exits_within_the_grace_with_the_last_checkpoint(tmp_path) -> None:
    """Step 1 of an episode run with the calculator; the resumed run's step 2 calls a tool that sleeps for ten
    minutes (its timeout longer still) and is stopped while the tool runs."""
    grace = 20.0
    store = tmp_path / "mlflow.db"
    base = [*TINY, f"logger.tracking_uri=sqlite:///{store}", f"logger.artifact_location={tmp_path}/artifacts",
            "checkpoint.every=1", f"run.shutdown_grace_s={grace}", "curriculum.prompts_per_step=2", "environment=tools",
            "environment.call_format._target_=tests.fixtures.call_formats.EveryTurnCalls", "environment.max_turns=2",
            "environment.max_episode_tokens=96", "environment.tool_timeout_s=900"]
    started = tmp_path / "tool-started"
    env = {**os.environ, "COLUMNS": "200", "GRPO_PIPE_TEST_TOOL_STARTED": str(started)}
    first = tmp_path / "first"
    done = subprocess.run([sys.executable, "-m", "grpo_pipe", *base, "trainer.steps=1", f"hydra.run.dir={first}"],
                          cwd=REPO, capture_output=True, text=True, timeout=600, env=env, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    hanging = ["environment.tools=[tests/fixtures/tools/hang.py:hang]", "+environment.call_format.tool=hang",
               "+environment.call_format.arguments={seconds: 600}"]
    second = tmp_path / "second"
    proc = subprocess.Popen(
        [sys.executable, "-m", "grpo_pipe", *base, *hanging, "trainer.steps=2", f"resume={first}",
         "resume_accept=[trainer.steps,environment.tools,environment.call_format]", f"hydra.run.dir={second}"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )
    with reaped(proc):
        _wait_for_text(started, "", proc)  # the file exists: step 2's first turn is done and its calls are running
        out, elapsed = stop_with_sigterm(proc, grace)
    assert proc.returncode == 128 + signal.SIGTERM, out[-3000:]
    assert elapsed < grace + 10, f"stop took {elapsed:.1f}s"
    assert "Stopped during step 2's generation (SIGTERM)" in out
    [saved] = sorted((first / "checkpoints").glob("step-*"))
    assert saved.name == "step-000001" and Checkpoint(saved).trainer_state()["version"] == 1
    client = MlflowClient(tracking_uri=f"sqlite:///{store}")
    [tracked] = client.search_runs([client.get_experiment_by_name("grpo_pipe").experiment_id])
    assert tracked.info.status == "KILLED"
