"""Memory that the trainer's process and the engine's worker process both map: the transport of
`weight_bridge=reload` (and of `ipc`, the other way round) when the engine runs in its own process.

A buffer is described by plain data that crosses vLLM's RPC: on a GPU a CUDA IPC handle (the
receiving process maps the very same device memory), on a CPU the name of a file in `/dev/shm`
(both processes map the same pages). Mapping happens once; every later sync only writes and
reads the memory, so nothing is serialised and nothing touches a disk.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from grpo_pipe.runtime import env
from grpo_pipe.transport.collective import Bucket, unpack


def _hex(raw: bytes | None) -> str | None:
    return None if raw is None else raw.hex()  # text crosses every RPC serialiser vLLM uses unchanged


def _bytes(text: str | None) -> bytes | None:
    return None if text is None else bytes.fromhex(text)


def cuda_handle(tensor: torch.Tensor) -> dict[str, Any]:
    """Plain data from which another process on the same GPU maps `tensor` (no copy)."""
    from torch.multiprocessing import reductions

    reduce_tensor: Callable[[torch.Tensor], tuple[object, tuple[Any, ...]]] = reductions.__dict__["reduce_tensor"]  # untyped
    _, args = reduce_tensor(tensor.detach())  # a CUDA tensor's 15 fields
    (_, size, stride, offset, _, dtype, device, handle, storage_bytes, storage_offset,
     _, ref_handle, ref_offset, event_handle, event_sync) = args
    return {"kind": "cuda", "size": list(size), "stride": list(stride), "offset": int(offset),
            "dtype": str(dtype).removeprefix("torch."), "device": int(device), "handle": _hex(handle),
            "storage_bytes": int(storage_bytes), "storage_offset": int(storage_offset),
            "ref_handle": _hex(ref_handle), "ref_offset": int(ref_offset), "event_handle": _hex(event_handle),
            "event_sync": bool(event_sync)}


def open_handle(handle: Mapping[str, Any]) -> torch.Tensor:
    """The tensor another process described with `cuda_handle` or `SharedBuckets.handles`."""
    if handle["kind"] == "file":
        return torch.from_file(handle["path"], shared=True, size=int(handle["nbytes"]), dtype=torch.uint8)
    from torch.multiprocessing import reductions

    rebuild_cuda_tensor: Callable[..., torch.Tensor] = reductions.__dict__["rebuild_cuda_tensor"]  # untyped in torch
    return rebuild_cuda_tensor(
        torch.Tensor, torch.Size(handle["size"]), tuple(handle["stride"]), handle["offset"], torch.UntypedStorage,
        getattr(torch, handle["dtype"]), handle["device"], _bytes(handle["handle"]), handle["storage_bytes"],
        handle["storage_offset"], False, _bytes(handle["ref_handle"]), handle["ref_offset"], _bytes(handle["event_handle"]),
        handle["event_sync"],
    )


def map_buckets(handles: Sequence[Mapping[str, Any]], wire_plan: Sequence[dict[str, Any]]
                ) -> tuple[list[torch.Tensor], list[tuple[str, torch.Tensor]]]:
    """Map the buffers another process described and cut them into named tensors, as `SharedBuckets`
    laid them out. Returns the mapped buffers (keep them: they hold the mappings open) and the views."""
    flats = [open_handle(h) for h in handles]
    views = [v for flat, wire in zip(flats, wire_plan) for v in unpack(flat, Bucket.from_wire(wire))]
    return flats, views


def engine_views(engine_params: Mapping[str, torch.Tensor], trainer_params: Mapping[str, torch.Tensor],
                 packed: Mapping[str, list[str]]) -> dict[str, torch.Tensor]:
    """For each trainer parameter name, the view of engine storage that holds it.

    `packed` is vLLM's `packed_modules_mapping` (e.g. qkv_proj -> [q_proj, k_proj, v_proj]): shards
    are stacked along dim 0 in that order, so offsets follow the trainer's own shard shapes.
    """
    views: dict[str, torch.Tensor] = {}
    for name, tensor in trainer_params.items():
        if name in engine_params:
            # vLLM may pad an embedding's rows (vocab) to a multiple of its tile size: the first rows are ours.
            views[name] = engine_params[name][: tensor.shape[0]] if tensor.dim() else engine_params[name]
            continue
        for fused, shards in packed.items():
            for index, shard in enumerate(shards):
                marker = f".{shard}."
                if marker not in name:
                    continue
                fused_name = name.replace(marker, f".{fused}.")
                if fused_name not in engine_params:
                    continue
                offset = sum(trainer_params[name.replace(marker, f".{s}.")].shape[0] for s in shards[:index])
                views[name] = engine_params[fused_name][offset : offset + tensor.shape[0]]
    missing = sorted(set(trainer_params) - set(views))
    if missing:
        raise RuntimeError(f"no engine tensor holds {missing[:5]} (of {len(missing)} trainer tensors)")
    return views


def copy_targets(model: torch.nn.Module, sources: list[tuple[str, torch.Tensor]]) -> list[torch.Tensor] | None:
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


class SharedBuckets:
    """Flat buffers in the engine's dtype, allocated once, that the engine's worker maps once.

    A sync copies the trainer's tensors into them (one device copy, casting where needed); the
    worker then copies them into its own parameters. GPU: device memory shared by CUDA IPC;
    CPU: files in a RAM-backed folder, mapped by both processes.

    Args:
        buckets: The planned buckets (`plan_buckets`): one flat buffer each, of its tensors in the engine's dtype.
        device: Where the trainer's tensors live: device memory on a GPU, a RAM-backed file per bucket on a CPU.
    """

    def __init__(self, buckets: Sequence[Bucket], device: torch.device) -> None:
        self.buckets = list(buckets)
        self.device = device
        self._folder: Path | None = None
        self.flats: list[torch.Tensor] = []
        self._paths: list[str] = []
        if device.type == "cpu":
            self._folder = Path(tempfile.mkdtemp(prefix="grpo_pipe-weights-", dir=env.fast_scratch_dir()))
        for index, bucket in enumerate(self.buckets):
            nbytes = bucket.numel * torch.empty((), dtype=getattr(torch, bucket.dtype)).element_size()
            if self._folder is None:
                self.flats.append(torch.empty(nbytes, dtype=torch.uint8, device=device))
            else:
                path = str(self._folder / f"bucket{index}")
                self._paths.append(path)
                self.flats.append(torch.from_file(path, shared=True, size=nbytes, dtype=torch.uint8))
        self.views = [v for flat, bucket in zip(self.flats, self.buckets) for _, v in unpack(flat, bucket)]

    @property
    def nbytes(self) -> int:
        return sum(flat.numel() for flat in self.flats)

    def handles(self) -> list[dict[str, Any]]:
        """What the worker needs to map every bucket (plain data)."""
        if self._folder is not None:
            return [{"kind": "file", "path": p, "nbytes": f.numel()} for p, f in zip(self._paths, self.flats)]
        return [cuda_handle(flat) for flat in self.flats]

    def wire_plan(self) -> list[dict[str, Any]]:
        return [bucket.to_wire() for bucket in self.buckets]

    def fill(self, tensors: Iterable[torch.Tensor]) -> None:
        """Copy the tensors, in plan order, into the buffers; visible to the other process on return."""
        sources = [t.detach() for t in tensors]
        if len(sources) != len(self.views):
            raise RuntimeError(f"shared buffers: {len(sources)} tensors for {len(self.views)} planned slots")
        with torch.no_grad():
            # One fused launch per batch of tensors, casting as needed. (torch does not list its _foreach
            # ops among its exports, though `torch._foreach_copy_` is theirs.)
            torch._foreach_copy_(self.views, sources)  # pyright: ignore[reportPrivateImportUsage, reportPrivateUsage]
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the worker reads on its own stream, in its own process

    def close(self) -> None:
        self.flats, self.views = [], []
        for path in self._paths:
            if os.path.exists(path):
                os.unlink(path)
        if self._folder is not None and self._folder.exists():
            self._folder.rmdir()
        self._paths, self._folder = [], None
