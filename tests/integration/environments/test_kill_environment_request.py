"""SIGKILL while the job serves an Atropos environment's request (`environment=atropos`: the job's engine behind its
endpoint, the Atropos API server and the environment process tests/fixtures/atropos/tiny_sums.py started by the job),
then a resume to the end. The endpoint holds the job's `REQUEST`-th generation request, received and not yet sampled
(`GRPO_PIPE_HALT_AT=environment_request@<n>`), and the job's main process is killed there: no timing window. Checked
as the chaos driver checks a run: no process of the killed job alive after it (the API server and the environment
process among them), every step trained once, one MLflow run continuing to FINISHED, the ledger balanced.

The n-th request is past the first checkpoint: a step takes one batch of 4 groups, one request each, and the engine
serves the environment only while the trainer waits for a batch (`max_staleness=0`), so step 1 answers the first 4
or so and the 10th arrives in step 2 or 3, after step 1's checkpoint.

Found by it (2026-11-29, 2-core CPU): the API server (`atroposlib.cli.run_api`) and the environment process were still
alive a minute after the kill: ordinary child processes, nothing tied them to the job (the server would have run for
good). Fixed by starting each under an undertaker (`runtime.undertaker`, as the split placement starts Ray's node),
dismissed when the job stops them itself."""

from __future__ import annotations

from pathlib import Path

from grpo_pipe.benchmarks.chaos import ChaosRun, checks
from tests.conftest import REPO, TINY

ENVIRONMENT = REPO / "tests" / "fixtures" / "atropos" / "tiny_sums.py"
STEPS = 4
REQUEST = 10
OVERRIDES = [o for o in TINY if not o.startswith("trainer.steps")] + [
    f"trainer.steps={STEPS}", "checkpoint.every=1", "run.eval_size=2", "run.eval_every=0", "logger.system_metrics=false",
    "environment=atropos", "reward=environment", f"environment.environments=[[{ENVIRONMENT},serve]]",
    "environment.report_every_s=5",
]


def test_sigkill_while_an_environments_request_is_served_leaves_no_process_and_the_resume_trains_every_step_once(
    tmp_path: Path,
) -> None:
    run = ChaosRun(tmp_path, OVERRIDES, cwd=REPO)
    killed = run.attempt(f"environment_request@{REQUEST}")
    assert killed.killed, (tmp_path / "attempt-1" / "job.log").read_text()[-3000:]
    assert (tmp_path / "attempt-1" / "halted").read_text() == f"environment_request@{REQUEST}\n"
    assert 1 <= run.last_checkpoint_step() < STEPS
    assert killed.left_alive == [], f"processes of the killed job still alive a minute after it: {killed.left_alive}"

    finished = run.attempt(None)
    assert finished.returncode == 0 and finished.left_alive == [], (tmp_path / "attempt-2" / "job.log").read_text()[-3000:]
    failures = checks(run, STEPS)
    # The driver also counts the groups that the rollout scheduler's record in the last checkpoint holds; the Atropos
    # source keeps none (the environments resend what was lost), only how many groups it pulled: one batch a step.
    failures["ledger balances"].remove("0 groups recorded trained, the ledger counts None")
    assert run.last_checkpoint()["scheduler"] == {"pulled": 4 * STEPS}
    assert {name: failed for name, failed in failures.items() if failed} == {}
