"""The fresh-engine check for the CPU-capable bridges, repeated on a GPU in bf16 (exact equality:
same weights, same engine settings, same batch, so the same kernels run)."""

import pytest
import torch

from tests.bridges.equality import train_sync_and_compare

GPU = ["data=gsm8k", "data.path=tests/fixtures/gsm8k", "data.train_file=test.jsonl", "rollout.dtype=bfloat16", "trainer.dtype=bfloat16", "rollout.gpu_memory_utilization=0.15"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize(
    ("bridge", "fresh_from"),
    [(["weight_bridge=reload", "trainer.lr=2e-3"], "merged"), (["weight_bridge=checkpoint", "trainer.lr=2e-3"], "merged"),
     (["weight_bridge=lora", "trainer.lr=5e-3", "policy.rank=8", "policy.alpha=16"], "adapter")],
    ids=["reload", "checkpoint", "lora"],
)
def test_bridge_matches_a_fresh_engine_on_gpu(compose_cfg, tmp_path, bridge, fresh_from) -> None:
    train_sync_and_compare(compose_cfg([*GPU, *bridge]), tmp_path / "saved", fresh_from)
