"""Reload (`weight_bridge=reload`): the trainer's tensors reach the live engine's weights directly; no
disk, no restart, no serialisation.

- Engine in this process (the CPU default): the tensors go straight into vLLM's own loader, which
  fuses qkv / gate_up itself (and repacks them for oneDNN on a CPU).
- Engine in its own process (the GPU default): the trainer keeps flat buckets in the engine's dtype
  that the engine's worker mapped once (CUDA IPC on a GPU, shared pages on a CPU). A sync is one copy
  into the buckets and one copy from them into the engine's parameters (a device copy each on a GPU),
  plus one RPC. The buckets cost one extra copy of the weights in memory; `weight_bridge=ipc` avoids
  even that, at the price of training in the engine's dtype.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from grpo_pipe.bridges.collective import plan_buckets
from grpo_pipe.bridges.contract import check_sync_every
from grpo_pipe.bridges.shared_memory import SharedBuckets
from grpo_pipe.config.errors import ConfigError
from grpo_pipe.interfaces import LocalEngine, Policy
from grpo_pipe.types import SyncStats

log = logging.getLogger(__name__)


class ReloadBridge:
    def __init__(self, sync_every: int = 1, bucket_mb: int = 1024) -> None:
        if bucket_mb < 1:
            raise ConfigError([f"weight_bridge.bucket_mb={bucket_mb}: must be >= 1"])
        self.sync_every = check_sync_every(sync_every)
        self.bucket_bytes = bucket_mb * 2**20
        self.engine: LocalEngine | None = None
        self._buckets: SharedBuckets | None = None

    def check(self, engine: object, policy: object) -> list[str]:
        """Problems with this engine, reported with the rest of the config errors."""
        if not isinstance(engine, LocalEngine):
            return [(
                f"weight_bridge=reload needs a vLLM engine on the trainer's machine (placement=colocated, rollout=vllm), "
                f"got {type(engine).__name__}; for engines elsewhere use weight_bridge=nccl, lora or checkpoint"
            )]
        if engine.device_ids is not None:
            return [(
                f"weight_bridge=reload shares memory with the engine on the trainer's device; rollout.device_ids="
                f"{engine.device_ids!r} puts it on another GPU: use weight_bridge=nccl"
            )]
        return []

    def engine_options(self) -> dict[str, Any]:
        return {}

    def connect(self, engine: LocalEngine, policy: Policy) -> None:  # `check` refused any other engine
        self.engine = engine
        if engine.in_process:
            return
        dtype = engine.weight_dtype
        shapes = [(name, torch.empty(tensor.shape, dtype=dtype, device="meta")) for name, tensor in policy.named_weights()]
        device = next(t for _, t in policy.named_weights()).device
        self._buckets = SharedBuckets(plan_buckets(shapes, self.bucket_bytes), device)
        path = engine.call_workers("grpo_map_shared", self._buckets.handles(), self._buckets.wire_plan())
        log.info("reload: %.2f GB shared with the engine process in %d bucket(s); loads by %s",
                 self._buckets.nbytes / 1e9, len(self._buckets.buckets), path[0])

    def push(self, policy: Policy, version: int) -> SyncStats:
        if self.engine is None:
            raise RuntimeError("bridge used before connect()")
        started = time.perf_counter()
        if self._buckets is None:
            dtype = self.engine.weight_dtype  # convert once here, not per tensor inside the engine
            weights = [(name, tensor.to(dtype)) for name, tensor in policy.named_weights()]
            gathered = time.perf_counter()
            self.engine.reload_weights(weights)
            nbytes = sum(t.numel() * t.element_size() for _, t in weights)
        else:
            self._buckets.fill(t for _, t in policy.named_weights())
            gathered = time.perf_counter()
            self.engine.call_workers("grpo_load_shared")
            nbytes = self._buckets.nbytes
        loaded = time.perf_counter()
        return SyncStats(
            gather_s=gathered - started,
            transport_s=0.0,
            load_s=loaded - gathered,
            pause_s=loaded - started,
            bytes_moved=nbytes,
            policy_version=version,
        )

    def close(self) -> None:
        if self._buckets is not None:
            if self.engine is not None and self.engine.is_running():
                try:
                    self.engine.call_workers("grpo_unmap_shared")
                except Exception as err:  # the engine may be gone already; its mappings went with it
                    log.debug("unmap: %r", err)
            self._buckets.close()
        self.engine, self._buckets = None, None
