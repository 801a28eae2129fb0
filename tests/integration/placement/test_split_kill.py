"""SIGKILL during a weight sync into a split placement (`placement=split`: the engine in a Ray actor, weights sent over
gloo by `weight_bridge=nccl`), then a resume to the end. The actor holds at its second receipt of weights
(`GRPO_PIPE_HALT_AT=grpo_receive_weights@2`, step 2's sync) while the trainer is sending: the job's main process is
killed there, no timing window. Checked as the chaos driver checks a run: no process of the run (Ray's own, the engine
actor) alive after the kill, every step trained once, one MLflow run continuing to FINISHED, the ledger balanced.

Found by it (2026-11-29, 2-core CPU, Ray 2.60): the raylet, the GCS and the engine actor died with the driver, but two
of Ray's per-node agents (`ray::DashboardAgent`, `ray::RuntimeEnvAgent`) were still alive a minute later. The raylet
starts them always (no Ray option leaves them out); they see its death within a second, then report it to the GCS, dead
too, with a fixed 60 s timeout before they exit. Fixed by an undertaker (`runtime/undertaker.py`) that the split
placement starts beside the node at `ray.init`: it notes the node's processes, the agents among them, and kills them
when the driver is gone, within a second of the kill."""

from __future__ import annotations

from pathlib import Path

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
    assert killed.left_alive == [], "processes of the killed job still alive a minute after it"
    assert {name: failed for name, failed in checks(run, STEPS).items() if failed} == {}
