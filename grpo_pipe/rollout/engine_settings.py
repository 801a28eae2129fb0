"""The vLLM engine's settings, one small group per concern (`rollout.memory`, `rollout.layout`, `rollout.features`).

Each group is what the config said, frozen; what `null` means on this machine is resolved by the engine where it
runs (`VllmEngine`), and each group's rules sit beside its fields (`config_problems`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from grpo_pipe.config.errors import failed
from grpo_pipe.runtime import env


@dataclass(frozen=True, kw_only=True)
class MemorySettings:
    """How much memory the engine takes, and whether it can give it back while the trainer runs.

    Args:
        gpu_memory_utilization: GPU only: the engine's share of the device (the trainer shares it).
        kv_cache_gib: CPU only: an explicit KV-cache size.
        max_num_seqs: Sequences the engine runs at once; None: vLLM's default for the machine.
        enable_sleep_mode: Whether `sleep` can free the engine's memory (needed by `placement.sleep_level > 0`).
    """

    gpu_memory_utilization: float = 0.35
    kv_cache_gib: float = 1.0
    max_num_seqs: int | None = None
    enable_sleep_mode: bool = False


@dataclass(frozen=True, kw_only=True)
class LayoutSettings:
    """Where the engine runs: in this process or one of its own, on which GPUs, over how many, on which thread.

    Args:
        in_process: The engine core in this process (True) or one of its own (False). None: resolved by the engine
            for the machine (its own process on a GPU, this one on a CPU; in `placement=split`'s engine actors, the
            actor's process).
        device_ids: GPUs for an engine process of its own, as indices among those this process sees (e.g. "1",
            the second of CUDA_VISIBLE_DEVICES when it is set); None: the trainer's devices.
        tensor_parallel_size: GPUs one replica spans (`placement=split` reserves them in Ray).
        background: Generate on a thread of its own, so the trainer trains while the engine generates the next
            batch. None: the runner decides (on exactly when the rollout scheduler may run ahead).
    """

    in_process: bool | None = None
    device_ids: str | None = None
    tensor_parallel_size: int = 1
    background: bool | None = None

    def config_problems(self) -> list[str]:
        # A null in_process with device ids set resolves to a process of its own, so the raw value is the one to judge.
        devices = None if self.device_ids is None else _device_ids_problem(str(self.device_ids))
        return failed(
            (self.tensor_parallel_size >= 1,
             f"rollout.layout.tensor_parallel_size={self.tensor_parallel_size}: must be >= 1"),
            (self.device_ids is None or self.in_process is not True,
             f"rollout.layout.device_ids={self.device_ids!r} needs rollout.layout.in_process=false "
             "(an engine process of its own)"),
            (devices is None, str(devices)),
        )


def _device_ids_problem(device_ids: str) -> str | None:
    """Why `device_ids` names no GPU this process may give its engine, or None."""
    try:
        env.among_visible(device_ids, os.environ.get("CUDA_VISIBLE_DEVICES"))
    except ValueError as err:
        return str(err)
    return None


@dataclass(frozen=True, kw_only=True)
class FeatureSettings:
    """Optional engine features: CUDA graphs, prefix caching, speculative decoding, per-request timestamps, and weight
    syncs that land mid-generation.

    Args:
        enforce_eager: No CUDA graphs. None: CUDA graphs on a GPU, eager on a CPU (resolved where it runs).
        enable_prefix_caching: vLLM's prefix cache (a request never reuses blocks computed with older weights).
        speculative_config: vLLM's speculative decoding settings; None: off.
        request_timestamps: Per-request queued / first / last token times (vLLM's request stats). Off unless asked
            for: vLLM's per-step stats cost ~10% of the decode rate (0.5B 8x8 on an H100, core in its own process:
            BENCHMARKS.md). None: the runner decides (on exactly when the reward reads them).
        in_flight_updates: Syncs from other threads land between engine steps (off: after the running call).
    """

    enforce_eager: bool | None = None
    enable_prefix_caching: bool = True
    speculative_config: dict[str, Any] | None = None
    request_timestamps: bool | None = None
    in_flight_updates: bool = True

    def __post_init__(self) -> None:
        # vLLM writes into the speculative config it is given: the engine gets a copy of its own, and {} means off.
        copied = dict(self.speculative_config) if self.speculative_config else None
        object.__setattr__(self, "speculative_config", copied)
