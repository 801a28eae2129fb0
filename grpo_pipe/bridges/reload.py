"""In-process reload: the trainer's tensors go straight into the live engine's weight loader.

No disk, no restart, no serialisation: the engine runs in the trainer's process
(`rollout.in_process=true`) and vLLM fuses qkv / gate_up itself from the Hugging Face names.
"""

from __future__ import annotations

import time
from typing import Any

from grpo_pipe.bridges.contract import check_sync_every
from grpo_pipe.interfaces import InProcessModelEngine, Policy
from grpo_pipe.types import SyncStats


class InProcessReloadBridge:
    def __init__(self, sync_every: int = 1) -> None:
        self.sync_every = check_sync_every(sync_every)
        self.engine: InProcessModelEngine | None = None

    def check(self, engine: object, policy: object) -> list[str]:
        """Problems with this engine, reported with the rest of the config errors."""
        if not isinstance(engine, InProcessModelEngine):
            return [
                f"weight_bridge=reload needs an engine that loads tensors in this process (placement=colocated, rollout=vllm), "
                f"got {type(engine).__name__}; for an engine elsewhere use weight_bridge=nccl, lora or checkpoint"
            ]
        if not engine.in_process:
            return [
                "weight_bridge=reload needs the engine in the trainer's process (placement=colocated, "
                "rollout.in_process=true); for an engine elsewhere use weight_bridge=nccl, lora or checkpoint"
            ]
        return []

    def engine_options(self) -> dict[str, Any]:
        return {}

    def connect(self, engine: InProcessModelEngine, policy: Policy) -> None:
        self.engine = engine

    def push(self, policy: Policy, version: int) -> SyncStats:
        if self.engine is None:
            raise RuntimeError("bridge used before connect()")
        started = time.perf_counter()
        dtype = self.engine.weight_dtype  # convert once here, not per tensor inside the engine
        weights = [(name, tensor.to(dtype)) for name, tensor in policy.named_weights()]
        gathered = time.perf_counter()
        self.engine.reload_weights(weights)
        loaded = time.perf_counter()
        return SyncStats(
            gather_s=gathered - started,
            transport_s=0.0,
            load_s=loaded - gathered,
            pause_s=loaded - started,
            bytes_moved=sum(t.numel() * t.element_size() for _, t in weights),
            policy_version=version,
        )

    def close(self) -> None:
        self.engine = None
