"""weight_bridge=ipc on a machine without a GPU: refused when the config is checked, naming the bridges that work
(the bridge itself: tests/gpu/bridges/test_ipc.py)."""

import os
import subprocess
import sys
import time

import pytest
import torch

from tests.conftest import REPO


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
