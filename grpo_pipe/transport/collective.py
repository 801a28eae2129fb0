"""A private process group between the trainer (rank 0) and the engine workers (ranks 1..N).

Built from c10d directly (TCPStore + ProcessGroupGloo/NCCL), so it never touches the default
process group that vLLM and the trainer may use for themselves. Every collective has a timeout:
a dead peer surfaces as an error, never a hang.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from torch.distributed.distributed_c10d import Store

TRAINER_RANK = 0
T = TypeVar("T")
_RANK_COUNTER = "grpo_pipe/next_engine_rank"

# Public as `torch.distributed.TCPStore` (documented), but torch's package does not re-export it to a type checker.
TCPStore = dist.TCPStore  # pyright: ignore[reportPrivateImportUsage, reportPrivateUsage]


class Group(Protocol):
    """What this module uses of a c10d backend (ProcessGroupGloo / ProcessGroupNCCL). torch's stubs leave
    the collectives out of those classes, though the objects have them."""

    def broadcast(self, tensor: torch.Tensor, root: int) -> dist.Work:
        """Send `tensor` from rank `root` to every rank of the group, in place.

        Args:
            tensor: The buffer: sent on the root, received on the others.
            root: The sending rank.
        """
        ...


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of a bucket, as the receiving side rebuilds it.

    Args:
        name: Its Hugging Face checkpoint name.
        shape: Its shape.
    """

    name: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Bucket:
    """Tensors sent as one flat buffer in one broadcast call.

    Args:
        dtype: The torch dtype's name of every tensor in it, e.g. "float32": one dtype per bucket.
        specs: Its tensors, in their order in the buffer.
    """

    dtype: str
    specs: tuple[TensorSpec, ...]

    @property
    def numel(self) -> int:
        return sum(int(torch.Size(s.shape).numel()) for s in self.specs)

    def to_wire(self) -> dict[str, Any]:
        """Plain data for the engine RPC (its serialiser turns dataclasses into dicts anyway)."""
        return {"dtype": self.dtype, "specs": [[s.name, list(s.shape)] for s in self.specs]}

    @classmethod
    def from_wire(cls, wire: dict[str, Any]) -> Bucket:
        return cls(wire["dtype"], tuple(TensorSpec(name, tuple(shape)) for name, shape in wire["specs"]))


def plan_buckets(weights: Sequence[tuple[str, torch.Tensor]], bucket_bytes: int) -> list[Bucket]:
    """Group tensors (in order) into buckets of at most `bucket_bytes` (a larger tensor gets its own)."""
    buckets: list[Bucket] = []
    current: list[TensorSpec] = []
    size, dtype = 0, None
    for name, tensor in weights:
        nbytes = tensor.numel() * tensor.element_size()
        name_dtype = str(tensor.dtype).removeprefix("torch.")
        if current and (size + nbytes > bucket_bytes or name_dtype != dtype):
            buckets.append(Bucket(dtype, tuple(current)))  # type: ignore[arg-type]
            current, size = [], 0
        current.append(TensorSpec(name, tuple(tensor.shape)))
        size += nbytes
        dtype = name_dtype
    if current:
        buckets.append(Bucket(dtype, tuple(current)))  # type: ignore[arg-type]
    return buckets


def by_bucket(items: Sequence[T], buckets: Sequence[Bucket]) -> list[Sequence[T]]:
    """`items`, one per tensor in plan order, cut into one run per bucket."""
    runs: list[Sequence[T]] = []
    start = 0
    for bucket in buckets:
        runs.append(items[start : start + len(bucket.specs)])
        start += len(bucket.specs)
    return runs


def pack(bucket: Bucket, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """One flat buffer in the bucket's dtype holding `tensors` in plan order, cast and copied in one fused
    launch (no intermediate copy per tensor)."""
    flat = torch.empty(bucket.numel, dtype=getattr(torch, bucket.dtype), device=tensors[0].device)
    with torch.no_grad():  # torch does not export its _foreach ops, though `_foreach_copy_` is theirs
        torch._foreach_copy_([view for _, view in unpack(flat, bucket)], list(tensors))  # pyright: ignore[reportPrivateImportUsage, reportPrivateUsage]
    return flat


def unpack(flat: torch.Tensor, bucket: Bucket) -> list[tuple[str, torch.Tensor]]:
    """Named views, one per tensor of `bucket`, into its flat buffer: typed as the bucket (a broadcast's
    receive buffer) or raw bytes (a shared-memory mapping), which are viewed as the bucket's dtype first."""
    values = flat.view(getattr(torch, bucket.dtype)) if flat.dtype == torch.uint8 else flat  # [bucket.numel]
    views: list[tuple[str, torch.Tensor]] = []
    offset = 0
    for spec in bucket.specs:
        numel = int(torch.Size(spec.shape).numel())
        views.append((spec.name, values[offset : offset + numel].view(spec.shape)))
        offset += numel
    return views


def host_store(host: str, timeout_s: float, world_size: int) -> TCPStore:
    """The trainer's rendezvous store on a free port (read it from `store.port`); returns at once."""
    timeout = datetime.timedelta(seconds=timeout_s)
    return TCPStore(host, 0, world_size, True, timeout=timeout, wait_for_workers=False)


def open_group(store: TCPStore, backend: str, timeout_s: float, world_size: int) -> Group:
    """The trainer's side: blocks until every engine worker joined, or fails after `timeout_s`."""
    return _group_on(store, backend, TRAINER_RANK, world_size, datetime.timedelta(seconds=timeout_s))


def join_group(
    backend: str, host: str, port: int, timeout_s: float, world_size: int
) -> tuple[Group, TCPStore]:
    """An engine worker's side. Ranks 1..N are handed out by the store in the order workers arrive,
    so replicas need no rank of their own from the caller."""
    timeout = datetime.timedelta(seconds=timeout_s)
    store = TCPStore(host, port, world_size, False, timeout=timeout)
    rank = int(store.add(_RANK_COUNTER, 1))
    return _group_on(store, backend, rank, world_size, timeout), store


def join_as_sender(backend: str, host: str, port: int, timeout_s: float, world_size: int) -> tuple[Group, TCPStore]:
    """The sending side, from a process other than the one that hosts the store (a sharded trainer's rank 0):
    blocks until every engine worker joined, or fails after `timeout_s`."""
    timeout = datetime.timedelta(seconds=timeout_s)
    store = TCPStore(host, port, world_size, False, timeout=timeout)
    return _group_on(store, backend, TRAINER_RANK, world_size, timeout), store


def _group_on(
    store: Store, backend: str, rank: int, world_size: int, timeout: datetime.timedelta
) -> Group:
    if backend == "gloo":
        return cast(Group, dist.ProcessGroupGloo(store, rank, world_size, timeout))
    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return cast(Group, dist.ProcessGroupNCCL(store, rank, world_size, options))
    raise AssertionError(f"backend={backend!r}: the bridge resolves it to gloo or nccl")  # checked in the config


def broadcast(group: Group, tensor: torch.Tensor) -> None:
    group.broadcast(tensor, TRAINER_RANK).wait()
