"""SIGKILL during a weight sync into a split placement (`placement=split`: the engine in a Ray actor, weights sent over
gloo by `weight_bridge=nccl`), then a resume to the end. The actor holds at its second receipt of weights
(`GRPO_PIPE_HALT_AT=grpo_receive_weights@2`, step 2's sync) while the trainer is sending: the job's main process is
killed there, no timing window. Checked as the chaos driver checks a run: no process of the run (Ray's own, the engine
actor) alive after the kill, every step trained once, one MLflow run continuing to FINISHED, the ledger balanced.

Found by it (2026-11-29, 2-core CPU, Ray as pinned): the raylet, the GCS and the engine actor die with the driver, but
two of Ray's per-node agents (`ray::DashboardAgent`, `ray::RuntimeEnvAgent`) are still alive a minute later. Everything
else holds; that one check is an expected failure, named with the processes, until `ray.init` in placement/split.py
makes them share the driver's fate."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_pipe.benchmarks.chaos import ChaosRun, checks
from tests.conftest import REPO, TINY

STEPS = 3
OVERRIDES = [o for o in TINY if not o.startswith("trainer.steps")] + [
    f"trainer.steps={STEPS}", "checkpoint.every=1", "run.eval_size=2", "logger.system_metrics=false",
    "placement=split", "weight_bridge=nccl",
]


def test_sigkill_during_a_weight_sync_into_an_actor_engine_leaves_no_process_and_the_resume_trains_every_step_once(
    tmp_path: Path,
) -> None:
    run = ChaosRun(tmp_path, OVERRIDES, cwd=REPO)
    killed = run.attempt("grpo_receive_weights@2")
    assert killed.killed, (tmp_path / "attempt-1" / "job.log").read_text()[-3000:]
    assert run.last_checkpoint_step() == 1

    finished = run.attempt(None)
    assert finished.returncode == 0 and finished.left_alive == [], (tmp_path / "attempt-2" / "job.log").read_text()[-3000:]
    found = {name: failed for name, failed in checks(run, STEPS).items() if failed}
    left = found.pop("no process left alive", [])
    assert found == {}
    assert left == [f"attempt 1: {p}" for p in killed.left_alive]  # the finished attempt left nothing
    if left:  # known: Ray's processes outlive a driver killed outright (its ray.init is in placement/split.py)
        pytest.xfail(f"processes of the killed job still alive a minute after it: {left}")
