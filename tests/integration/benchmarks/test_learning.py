"""The learning benchmark: its marks, and a whole run on the tiny model beside TRL (CPU: TRL without vLLM)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_pipe.benchmarks.curves import Marks
from tests.conftest import REPO, TINY


def test_marks_fall_every_interval_of_training_time_and_the_budget_ends_it() -> None:
    marks = Marks(budget_s=10.0, every_s=3.0)
    seen = [(t, marks.due(t), marks.over(t)) for t in (1.0, 3.2, 4.0, 7.5, 8.0, 10.1)]
    assert seen == [(1.0, False, False), (3.2, True, False), (4.0, False, False), (7.5, True, False),
                    (8.0, False, False), (10.1, True, True)]


def test_a_run_beside_trl_grades_every_snapshot_of_both(tmp_path: Path) -> None:
    pytest.importorskip("trl", reason="the peer is the optional extra `peer` (pip install trl==1.16.0)")
    out = tmp_path / "learning.json"
    # A reward that moves the weights (the tiny model never answers right); its `correct` flags grade.
    reward = ["reward=python", f"reward.fn={REPO}/tests/fixtures/length_reward.py:by_length", "reward.success_at=0.5"]
    command = [sys.executable, "-m", "grpo_pipe.benchmarks.learning", "--minutes", "0.1", "--mark-every", "0.05",
               "--peer", "trl", "--json", str(out), *TINY, *reward, "trainer.steps=1000"]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=900,
                          env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(out.read_text())["summary"]
    for tool in ("grpo_pipe", "trl"):
        curve = summary[tool]["curve"]
        assert curve[0]["minutes"] == 0.0 and curve[0]["step"] == 0  # the starting weights, graded too
        assert len(curve) >= 2 and curve[-1]["minutes"] >= 0.1 and curve[-1]["step"] == summary[tool]["steps"]
        assert all(0.0 <= point["accuracy"] <= 1.0 for point in curve)
    assert "grpo_pipe reaches trl's final accuracy" in done.stdout
    metrics = json.loads(out.read_text())["step_metrics"]["grpo_pipe"]
    assert all("mismatch/logprob_abs_mean" in m for m in metrics)
