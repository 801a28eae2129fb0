"""The rollout benchmark runs end to end on CPU at its smallest size (the figures are not checked: timing)."""

import json
import subprocess
import sys

import pytest

from grpo_pipe.benchmarks.rollout import measure_round
from tests.conftest import REPO


def test_rollout_benchmark_prints_raw_pipeline_and_step_figures(tmp_path) -> None:
    out = tmp_path / "rollout.json"
    proc = subprocess.run(
        [sys.executable, "-m", "grpo_pipe.benchmarks.rollout", "--batches", "2x2,3x1", "--max-tokens", "8",
         "--repeats", "1", "--rounds", "2", "--steps", "3", "--json", str(out), "model=tiny_random", "rollout.dtype=float32",
         "rollout.memory.kv_cache_gib=0.25", "rollout.max_model_len=512", "logger=none", "data.train_size=16",
         "data.eval_size=4"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    raw = [r for r in result["engines"] if r["engine"].startswith("raw vLLM")]
    ours = [r for r in result["engines"] if r["engine"].startswith("grpo_pipe rollout engine (in-process, eager")]
    assert [(r["round"], r["batch"]) for r in ours] == [(1, "2x2"), (1, "3x1"), (2, "2x2"), (2, "3x1")]
    assert [(r["round"], r["batch"], "token ids only" in r["engine"]) for r in raw] == [  # texts, then ids only
        (n, batch, ids) for n in (1, 2) for batch in ("2x2", "3x1") for ids in (False, True)]
    for batch in ("2x2", "3x1"):  # the median over rounds of each round's ratio
        in_rounds = [r["vs_raw"] for r in ours if r["batch"] == batch]
        assert result["vs_raw"][batch] == {"median": pytest.approx(sum(in_rounds) / 2), "rounds": in_rounds}
    assert all(r["tokens"] > 0 for r in raw + ours) and all(r["vs_raw"] > 0 for r in ours)
    assert len(result["end_to_end"]["step_times_s"]) == 3 and result["end_to_end"]["step_s"] > 0
    assert "tok/s" in proc.stdout and "s/step" in proc.stdout and "over 2 rounds: median" in proc.stdout


def test_rounds_alternate_which_engine_starts_first() -> None:
    started: list[str] = []

    def measure(name: str):
        def run() -> list[dict]:
            started.append(name)
            return [{"engine": name}]

        return run

    results = [measure_round(n, measure("raw"), measure("ours")) for n in (1, 2, 3)]
    assert started == ["raw", "ours", "ours", "raw", "raw", "ours"]
    assert results == [([{"engine": "raw"}], [{"engine": "ours"}])] * 3  # always returned as (raw, ours)
