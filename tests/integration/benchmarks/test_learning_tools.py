"""The learning benchmark on a tool job beside TRL (tiny model, CPU): TRL trains with its own tool loop from our prompt
tokens, and both tools' snapshots are graded on the job's episodes, greedy and sampled."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, TINY


def test_a_tool_job_beside_trl_grades_the_episodes_of_both(tmp_path: Path) -> None:
    pytest.importorskip("trl", reason="the peer is the optional extra `peer` (pip install trl==1.16.0)")
    out = tmp_path / "learning.json"
    reward = ["reward=python", f"reward.fn={REPO}/tests/fixtures/length_reward.py:by_length", "reward.success_at=0.5"]
    tools = ["environment=tools", "environment.max_turns=2", "environment.max_episode_tokens=48"]
    command = [sys.executable, "-m", "grpo_pipe.benchmarks.learning", "--minutes", "0.1", "--mark-every", "0.05",
               "--peer", "trl", "--grade-size", "4", "--sampled-k", "2", "--json", str(out), *TINY, *reward, *tools,
               "trainer.steps=1000"]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "TRL peer: all 64 prompts are token for token those our episodes start from" in done.stderr
    assert "held-out tasks (episodes with tools, greedy" in done.stdout
    payload = json.loads(out.read_text())
    summary = payload["summary"]
    assert all("tools/call_frequency" in log for log in payload["step_metrics"]["trl"])
    for tool in ("grpo_pipe", "trl"):  # each step's first episodes, turn by turn, for a person to read
        rows = payload["samples"][tool]
        assert rows and all(row["turns"][0]["role"] == "assistant" for row in rows), tool
        assert {row["step"] for row in rows} >= {1}, tool
    for tool in ("grpo_pipe", "trl"):
        row = summary[tool]
        assert all(0.0 <= point["accuracy"] <= 1.0 for point in row["curve"]) and len(row["curve"]) >= 2
        assert 0.0 <= row["sampled_accuracy_first"] <= 1.0 and 0.0 <= row["sampled_accuracy_last"] <= 1.0
