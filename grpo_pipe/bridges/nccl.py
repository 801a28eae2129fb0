"""Broadcast bridge (`weight_bridge=nccl`): the trainer sends its weights to an engine running in
another process (another GPU, or another CPU process) over a private collective group: NCCL on
GPUs, gloo on CPUs, so the very same cross-process path runs in CPU tests.

Tensors are cast to the engine's dtype and packed into flat buckets of `bucket_mb`, one broadcast
call per bucket rather than one per tensor. The engine side (`BroadcastReceiver`, below) unpacks views
and calls vLLM's own loader. Every collective has a timeout, so a dead peer is an error, not a hang.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch

from grpo_pipe.bridges.contract import sync_every_rule
from grpo_pipe.bridges.shared_memory import copy_targets
from grpo_pipe.config.errors import failed
from grpo_pipe.interfaces import Policy, RolloutEngine, SendingPolicy, WorkerRpcEngine
from grpo_pipe.rollout.worker_extension import EngineWorker, worker_extension
from grpo_pipe.rollout.worker_weights import refresh_cpu_tied_lm_head
from grpo_pipe.trainer.errors import TrainerLost
from grpo_pipe.transport.collective import (
    TRAINER_RANK,
    Bucket,
    broadcast,
    by_bucket,
    host_store,
    join_group,
    open_group,
    pack,
    plan_buckets,
    unpack,
)
from grpo_pipe.types import SyncStats

_SENDER_JOINED = object()  # the group lives in the sending policy's process, not here


class _Call:
    """Runs a blocking engine call on a helper thread while this thread drives the collective."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self.result = fn()
        except BaseException as err:  # re-raised on the caller's thread
            self.error = err

    def wait(self, timeout_s: float) -> Any:
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise TimeoutError(f"engine did not finish the weight transfer within {timeout_s:.0f}s")
        if self.error is not None:
            raise self.error
        return self.result


class BroadcastBridge:
    """`weight_bridge=nccl`: the weights are broadcast in flat buckets to an engine in another process, over a private group.

    Args:
        sync_every: Optimizer steps between syncs.
        backend: `nccl` (CUDA GPUs), `gloo` (CPUs) or `auto` (nccl with CUDA, else gloo).
        bucket_mb: Size of the flat buckets tensors are packed into: one broadcast call per bucket.
        host: The address the group's rendezvous store binds to.
        timeout_s: A dead peer becomes an error after this long, not a hang.
    """

    def __init__(
        self,
        *,
        sync_every: int = 1,
        backend: Literal["auto", "gloo", "nccl"] = "auto",
        bucket_mb: int = 256,
        host: str = "127.0.0.1",
        timeout_s: float = 120.0,
    ) -> None:
        self.sync_every = sync_every
        self.backend = backend
        self.bucket_mb = bucket_mb
        self.bucket_bytes = bucket_mb * 2**20
        self.host = host
        self.timeout_s = timeout_s
        self.engine: WorkerRpcEngine | None = None  # whose workers receive the broadcast
        self._dtype: torch.dtype | None = None  # the dtype the engine holds its weights in
        self._group: Any = None
        self._store: Any = None
        self._plan: tuple[Any, list[Bucket], list[dict[str, Any]]] | None = None  # (names, shapes, dtype) -> buckets
        self._sender: SendingPolicy | None = None  # a policy that broadcasts from its own process

    def config_problems(self) -> list[str]:
        return failed(
            sync_every_rule(self.sync_every),
            (self.bucket_mb >= 1, f"weight_bridge.bucket_mb={self.bucket_mb}: must be >= 1"),
            (self.backend in ("auto", "gloo", "nccl"), f"weight_bridge.backend={self.backend!r}: allowed: auto, gloo, nccl"),
        )

    @property
    def resolved_backend(self) -> str:
        if self.backend == "auto":
            return "nccl" if torch.cuda.is_available() else "gloo"
        return self.backend

    def check(self, engine: object, policy: object) -> list[str]:
        problems: list[str] = []
        if not isinstance(engine, WorkerRpcEngine):
            problems.append(f"weight_bridge=nccl needs an engine whose workers run bridge code, got {type(engine).__name__}")
        if self.resolved_backend == "nccl" and not torch.cuda.is_available():
            problems.append("weight_bridge.backend=nccl needs CUDA GPUs; use backend=gloo (or auto) on CPU")
        return problems

    def engine_options(self) -> dict[str, Any]:
        return worker_extension(BroadcastReceiver)

    def connect(self, engine: RolloutEngine, policy: Policy) -> None:
        if not isinstance(engine, WorkerRpcEngine):  # `check` refused this before anything loaded
            raise TypeError(f"weight_bridge=nccl needs an engine whose workers run bridge code, got {type(engine).__name__}")
        self.engine, self._dtype = engine, engine.weight_dtype
        world_size = 1 + engine.worker_count()  # one broadcast reaches every engine worker at once
        self._store = host_store(self.host, self.timeout_s, world_size)
        port = self._store.port
        joining = _Call(
            lambda: engine.call_workers(
                "grpo_open_weight_group", self.resolved_backend, self.host, port, self.timeout_s, world_size
            )
        )
        self._sender = policy if isinstance(policy, SendingPolicy) and policy.sends_own_weights else None
        if self._sender is not None:  # the group's rank 0 is the policy's own process (the sharded trainer's rank 0)
            self._sender.open_weight_group(self.resolved_backend, self.host, port, self.timeout_s, world_size)
            self._group = _SENDER_JOINED
        else:
            self._group = open_group(self._store, self.resolved_backend, self.timeout_s, world_size)
        joining.wait(self.timeout_s)

    def push(self, policy: Policy, version: int) -> SyncStats:
        if self.engine is None or self._group is None or self._dtype is None:
            raise RuntimeError("bridge used before connect()")
        engine = self.engine
        started = time.perf_counter()
        if self._sender is not None:
            specs = [(name, torch.empty(shape, device="meta")) for name, shape in self._sender.weight_specs()]
            _, wire = self._plan_for(specs, self._dtype)
            sources: list[tuple[str, torch.Tensor]] = []
        else:
            sources = [(name, t.detach()) for name, t in policy.named_weights()]
            _, wire = self._plan_for(sources, self._dtype)
        gathered = time.perf_counter()
        receiving = _Call(lambda: engine.call_workers("grpo_receive_weights", wire, timeout_s=self.timeout_s))
        try:
            sender_times = self._send_all(sources)
        except TrainerLost:  # the sending rank is gone and the engine's workers wait in the broadcast for it:
            self._group = self._sender = None  # waiting for their call, or asking them to leave, would only delay
            raise  # the stop; the engine's shutdown ends their side
        except RuntimeError:  # the receiving side went away mid-broadcast: its call says why (a lost engine
            receiving.wait(self.timeout_s)  # raises EngineLost, which the runner recovers from)
            raise
        sent = time.perf_counter()
        reports = receiving.wait(self.timeout_s)  # one per engine worker
        engine.after_external_weight_update()
        done = time.perf_counter()
        gather_s = sender_times["gather_s"] if sender_times else gathered - started
        return SyncStats(
            gather_s=gather_s,
            transport_s=sent - gathered - (gather_s if sender_times else 0.0),
            load_s=max(float(r["load_s"]) for r in reports),
            pause_s=done - started,
            bytes_moved=int(sum(r["bytes"] for r in reports)),
            policy_version=version,
        )

    def _send_all(self, sources: list[tuple[str, torch.Tensor]]) -> dict[str, float] | None:
        """Send from here, or have the policy's own process send (its gather and send times, then)."""
        assert self._plan is not None  # planned by `push` just before
        if self._sender is not None:
            return self._sender.broadcast_weights(self._plan[2])
        self._send(self._plan[1], [t for _, t in sources])
        return None

    def _plan_for(self, sources: list[tuple[str, torch.Tensor]], dtype: torch.dtype) -> tuple[list[Bucket], list[dict[str, Any]]]:
        """The buckets for these tensors in the engine's dtype, and their wire form: planned once, reused
        while the names and shapes stay the same (every sync of a run)."""
        key = (dtype, tuple((name, tuple(t.shape)) for name, t in sources))
        if self._plan is None or self._plan[0] != key:
            shapes = [(name, torch.empty(t.shape, dtype=dtype, device="meta")) for name, t in sources]
            plan = plan_buckets(shapes, self.bucket_bytes)
            self._plan = (key, plan, [b.to_wire() for b in plan])
        return self._plan[1], self._plan[2]

    def _send(self, plan: list[Bucket], tensors: list[torch.Tensor]) -> None:
        """Pack each bucket (cast and copy in one launch) and broadcast it. Over NCCL nothing waits between
        buckets: bucket k+1 is packed on the compute stream while bucket k travels on NCCL's stream, and
        every broadcast is waited for at the end (its buffer lives until then)."""
        in_flight: list[tuple[Any, torch.Tensor]] = []
        for bucket, chunk in zip(plan, by_bucket(tensors, plan)):
            flat = pack(bucket, chunk)
            work = self._group.broadcast(flat, TRAINER_RANK)
            if self.resolved_backend == "nccl":
                in_flight.append((work, flat))
            else:  # gloo runs on its own threads: one bucket at a time keeps their order plain
                work.wait()
        for work, _ in in_flight:
            work.wait()

    def close(self) -> None:
        if self.engine is not None and self.engine.is_running() and self._group is not None:
            try:
                self.engine.call_workers("grpo_close_weight_group", timeout_s=self.timeout_s)
            except Exception:  # the engine may already be gone; nothing left to release here
                pass
        if self._sender is not None:
            try:
                self._sender.close_weight_group()
            except Exception:  # a lost trainer rank: the run is stopping anyway
                pass
        self.engine, self._group, self._store, self._sender = None, None, None, None


class BroadcastReceiver(EngineWorker):
    """The engine side of `nccl`: join the trainer's group, receive each bucket, hand it to vLLM's loader."""

    def grpo_open_weight_group(self, backend: str, host: str, port: int, timeout_s: float, world_size: int) -> None:
        self._grpo_group, self._grpo_store = join_group(backend, host, port, timeout_s, world_size)

    def grpo_receive_weights(self, wire_plan: list[dict[str, Any]]) -> dict[str, float]:
        """Receive every bucket and load it. Returns bytes received and the receive / load times.

        On a GPU each bucket is copied straight into the engine's parameter slices it belongs to (one
        fused launch per bucket, found once per run: `copy_targets`) as soon as it arrives, so the copy
        of bucket k overlaps the broadcast of bucket k+1; where some tensor has no exact slot (a quantised
        or sharded layout) vLLM's loader does the work instead. The CPU reload path repacks whole layers,
        so there all buckets are loaded together at the end.
        """
        started = time.perf_counter()
        device = torch.device(self.device) if hasattr(self, "device") else torch.device("cpu")
        buckets = [Bucket.from_wire(wire) for wire in wire_plan]
        targets = self._grpo_bucket_targets(buckets) if device.type == "cuda" else None
        received: list[tuple[str, torch.Tensor]] = []
        nbytes = 0
        for index, bucket in enumerate(buckets):
            flat = torch.empty(bucket.numel, dtype=getattr(torch, bucket.dtype), device=device)
            broadcast(self._grpo_group, flat)  # on a GPU: the compute stream waits for it, this thread does not
            nbytes += flat.numel() * flat.element_size()
            views = unpack(flat, bucket)
            if device.type == "cpu":
                received.extend(views)
            elif targets is not None:
                with torch.no_grad():  # `_foreach_copy_` is torch's own, though not among its exports
                    torch._foreach_copy_(list(targets[index]), [view for _, view in views])  # pyright: ignore[reportPrivateImportUsage, reportPrivateUsage]
            else:
                self.model_runner.model.load_weights(weights=views)
        arrived = time.perf_counter()
        if device.type == "cpu":
            self.reload_weights(weights_iterator=iter(received))
            refresh_cpu_tied_lm_head(self)
        else:
            torch.cuda.synchronize(device)
        return {"bytes": float(nbytes), "receive_s": arrived - started, "load_s": time.perf_counter() - arrived}

    def _grpo_bucket_targets(self, buckets: list[Bucket]) -> list[Sequence[torch.Tensor]] | None:
        """Per bucket, the engine parameter slices its tensors are copied into (None: vLLM's loader loads).
        Found once and kept while the plan and the engine's parameter storage stay the same."""
        model = self.model_runner.model
        key = (tuple(buckets), tuple(p.data_ptr() for p in model.parameters()))
        cached = getattr(self, "_grpo_targets_for", None)
        if cached is None or cached[0] != key:
            sources = [(spec.name, torch.empty(spec.shape, dtype=getattr(torch, bucket.dtype), device="meta"))
                       for bucket in buckets for spec in bucket.specs]
            targets = copy_targets(model, sources)
            self._grpo_targets_for = cached = (key, None if targets is None else by_bucket(targets, buckets))
        return cached[1]

    def grpo_receive_raw(self, nbytes: int) -> None:
        """Receive one flat buffer and drop it: the transport floor, for benchmarks."""
        device = self.device if hasattr(self, "device") else torch.device("cpu")
        broadcast(self._grpo_group, torch.empty(nbytes, dtype=torch.uint8, device=device))

    def grpo_close_weight_group(self) -> None:
        for attr in ("_grpo_group", "_grpo_store", "_grpo_targets_for"):
            if hasattr(self, attr):
                delattr(self, attr)
