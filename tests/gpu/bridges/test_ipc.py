"""weight_bridge=ipc on a GPU: the engine reads the trainer's own storage, nothing is copied (the refusal on a
machine without one: tests/integration/bridges/test_ipc.py)."""

import torch

from tests.bridge_equality import train_sync_and_compare

GPU = ["data=gsm8k", "data.path=tests/fixtures/gsm8k", "data.train_file=test.jsonl", "weight_bridge=ipc",
       "rollout.dtype=bfloat16", "trainer.precision.dtype=bfloat16", "trainer.optimisation.lr=2e-3",
       "rollout.memory.gpu_memory_utilization=0.15", "rollout.memory.max_num_seqs=16"]


def test_ipc_matches_a_fresh_engine_and_moves_no_bytes(compose_cfg, tmp_path) -> None:
    stats = train_sync_and_compare(compose_cfg(GPU), tmp_path / "saved")
    assert stats.bytes_moved == 0


def test_ipc_keeps_one_copy_of_the_weights(compose_cfg) -> None:
    from transformers import AutoTokenizer

    from grpo_pipe.runner.pipeline import build

    parts = build(compose_cfg(GPU))
    engine, trainer, bridge = parts.rollout, parts.trainer, parts.weight_bridge
    assert engine.in_process is False  # the GPU default: the engine's storage lives in another process
    path = parts.model.materialize()
    engine.connect(path, bridge.engine_options())
    try:
        trainer.setup(path, torch.device("cuda"), pad_id=AutoTokenizer.from_pretrained(path).pad_token_id)
        before = torch.cuda.memory_allocated()
        bridge.connect(engine, trainer.policy)
        freed = before - torch.cuda.memory_allocated()
        spans = bridge.engine_storage_spans()
        for name, param in trainer.policy.module.named_parameters():
            assert any(lo <= param.data_ptr() < hi for lo, hi in spans), f"{name} is not engine storage"
        assert freed >= 0.9 * bridge.shared_bytes  # the trainer's own copy is gone
    finally:
        bridge.close()
        engine.shutdown()
