"""The fresh-engine check for the CPU-capable bridges, repeated on a GPU in bf16 with the GPU defaults (engine
core in its own process, CUDA graphs): exact equality, since the same weights, settings and batch run the same
kernels."""

import pytest
import torch

from tests.bridge_equality import GREEDY, train_sync_and_compare

# A small max_num_seqs keeps CUDA-graph capture (one graph per batch size) short in tests.
GPU = ["data=gsm8k", "data.path=tests/fixtures/gsm8k", "data.train_file=test.jsonl", "rollout.dtype=bfloat16",
       "trainer.dtype=bfloat16", "rollout.gpu_memory_utilization=0.15", "rollout.max_num_seqs=16"]


@pytest.mark.parametrize(
    ("bridge", "fresh_from"),
    [(["weight_bridge=reload", "trainer.lr=2e-3"], "merged"), (["weight_bridge=checkpoint", "trainer.lr=2e-3"], "merged"),
     (["weight_bridge=lora", "trainer.lr=5e-3", "policy.rank=8", "policy.alpha=16"], "adapter")],
    ids=["reload", "checkpoint", "lora"],
)
def test_bridge_matches_a_fresh_engine_on_gpu(compose_cfg, tmp_path, bridge, fresh_from) -> None:
    cfg = compose_cfg([*GPU, *bridge])
    assert cfg.rollout.in_process is None and cfg.rollout.enforce_eager is None  # the defaults: out of process, graphs
    train_sync_and_compare(cfg, tmp_path / "saved", fresh_from)


def test_an_engine_process_with_cuda_graphs_sleeps_and_wakes_with_the_same_outputs(compose_cfg) -> None:
    from hydra.utils import instantiate

    from grpo_pipe.models.tiny_random import TinyRandomModel

    engine = instantiate(compose_cfg([*GPU, "rollout.enable_sleep_mode=true"]).rollout, _convert_="all")
    assert engine.in_process is False
    engine.connect(TinyRandomModel().materialize())
    try:
        prompts = [[3 + (7 * i + j) % 300 for j in range(20)] for i in range(4)]
        before = [g[0].token_ids for g in engine.generate(prompts, [1] * 4, GREEDY)]
        free_awake = torch.cuda.mem_get_info()[0]
        engine.sleep(1)
        assert torch.cuda.mem_get_info()[0] > free_awake  # the engine process gave memory back
        engine.wake_up()
        assert [g[0].token_ids for g in engine.generate(prompts, [1] * 4, GREEDY)] == before
    finally:
        engine.shutdown()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs: trainer on one, engine process on the other")
def test_nccl_broadcast_to_an_engine_on_another_gpu_matches_a_fresh_engine(compose_cfg, tmp_path) -> None:
    cfg = compose_cfg([*GPU, "weight_bridge=nccl", "weight_bridge.bucket_mb=64", "rollout.in_process=false",
                       "rollout.device_ids='1'", "trainer.lr=2e-3"])
    stats = train_sync_and_compare(cfg, tmp_path / "saved")
    assert stats.bytes_moved > 0
