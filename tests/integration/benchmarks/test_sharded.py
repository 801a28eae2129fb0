"""The sharded-trainer benchmark runs end to end on CPU at its smallest size: world sizes 1 and 2 over gloo on the
tiny model, the same losses, and a world-size-2 checkpoint (each rank's shards, as the runner writes them) resumed
at world size 1 (timings are not checked)."""

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO


def test_sharded_benchmark_trains_both_world_sizes_alike_and_resumes_the_larger_at_the_smaller(tmp_path) -> None:
    out = tmp_path / "sharded.json"
    proc = subprocess.run(
        [sys.executable, "-m", "grpo_pipe.benchmarks.sharded", "--world-sizes", "1,2", "--steps", "2", "--prompts", "2",
         "--samples", "2", "--prompt-tokens", "6", "--completion-tokens", "5", "--json", str(out), "model=tiny_random",
         "trainer.batching.micro_batch_size=1"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    one, two = json.loads(out.read_text())["rows"]
    assert (one["world_size"], two["world_size"]) == (1, 2) and len(one["steps_s"]) == len(two["steps_s"]) == 2
    # fp32 on CPU: the same batches from the same weights give the same losses and grad norms at both sizes.
    assert two["losses"] == pytest.approx(one["losses"], rel=1e-4, abs=1e-9)
    assert two["grad_norms"] == pytest.approx(one["grad_norms"], rel=1e-4) and all(n > 0 for n in one["grad_norms"])
    assert two["resumed_loss"] == pytest.approx(two["next_loss"], rel=1e-4, abs=1e-9)
    assert two["resumed_at"] == 1 and two["checkpoint_write_s"] > 0 and "read at world size 1" in proc.stdout

