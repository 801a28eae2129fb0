"""The endpoint benchmark end to end on CPU at its smallest size: both paths generate on the same engine and the ratio
is the median of the rounds' (the figures themselves are not checked: timing)."""

import json
import statistics

from grpo_pipe.benchmarks.endpoint import main


def test_endpoint_benchmark_measures_both_paths_on_one_engine_and_reports_the_median_ratio(tmp_path, capsys) -> None:
    out = tmp_path / "endpoint.json"
    result = main(["--prompts", "6", "--samples", "2", "--max-tokens", "8", "--rounds", "2", "--json", str(out),
                   "model=tiny_random", "rollout.dtype=float32", "rollout.memory.kv_cache_gib=0.25", "rollout.max_model_len=512",
                   "logger=none", "data.train_size=16", "data.eval_size=4"])
    assert json.loads(out.read_text()) == result
    assert [r["round"] for r in result["rounds"]] == [1, 2]
    for row in result["rounds"]:
        assert row["engine"]["tokens"] > 0 and row["endpoint"]["tokens"] > 0
        assert 1 <= row["endpoint"]["engine_calls"] <= 6  # six requests, gathered into batched engine calls
        assert row["ratio"] == row["endpoint"]["tokens_per_s"] / row["engine"]["tokens_per_s"]
    assert result["ratio"]["median"] == statistics.median(r["ratio"] for r in result["rounds"])
    assert "median" in capsys.readouterr().out
