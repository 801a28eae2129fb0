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


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs: trainer on one, engine process on the other")
def test_nccl_broadcast_to_an_engine_on_another_gpu_matches_a_fresh_engine(compose_cfg, tmp_path) -> None:
    cfg = compose_cfg([*GPU, "weight_bridge=nccl", "weight_bridge.bucket_mb=64", "rollout.in_process=false",
                       "rollout.device_ids='1'", "trainer.lr=2e-3"])
    stats = train_sync_and_compare(cfg, tmp_path / "saved")
    assert stats.bytes_moved > 0
