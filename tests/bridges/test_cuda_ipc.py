import os
import subprocess
import sys
import time

import pytest
import torch

from tests.bridges.equality import train_sync_and_compare
from tests.conftest import REPO

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="weight_bridge=ipc needs a CUDA GPU")
GPU = ["data=gsm8k", "data.path=tests/fixtures/gsm8k", "data.train_file=test.jsonl", "weight_bridge=ipc",
       "rollout.dtype=bfloat16", "trainer.dtype=bfloat16", "trainer.lr=2e-3", "rollout.gpu_memory_utilization=0.15",
       "rollout.max_num_seqs=16"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on machines without a GPU")
def test_ipc_on_cpu_fails_at_config_time_naming_what_works(tmp_path) -> None:
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "grpo_pipe", "weight_bridge=ipc", f"hydra.run.dir={tmp_path}"],
        cwd=REPO, capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "300"},
    )
    assert proc.returncode == 2
    out = proc.stdout + proc.stderr
    assert "weight_bridge=ipc needs a CUDA GPU" in out and "use weight_bridge=reload, lora, nccl or checkpoint" in out
    assert time.perf_counter() - started < 30


@pytest.mark.gpu
@needs_gpu
def test_ipc_matches_a_fresh_engine_and_moves_no_bytes(compose_cfg, tmp_path) -> None:
    stats = train_sync_and_compare(compose_cfg(GPU), tmp_path / "saved")
    assert stats.bytes_moved == 0


@pytest.mark.gpu
@needs_gpu
def test_ipc_keeps_one_copy_of_the_weights(compose_cfg) -> None:
    from transformers import AutoTokenizer

    from grpo_pipe.pipeline import build

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
