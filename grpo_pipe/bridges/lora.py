"""LoRA hot-swap (`weight_bridge=lora`): at each sync the running engine switches to the newly trained adapter.

The base weights never move; only the adapter (a few MB) does, and the engine is never restarted.
Two transports (`transport`):
- `memory` (an engine on this machine, `rollout=vllm`): the trainer keeps one flat buffer in the
  engine's dtype that the engine's worker mapped once (CUDA IPC on a GPU, shared pages on a CPU). A
  sync copies the adapter into it and the worker builds the adapter from it through vLLM's own
  `add_lora`: no file is written or read.
- `folder`: the adapter is saved in peft's folder format (RAM-backed where possible) and the engine
  loads it by path: what engines in other processes or on other machines (Ray) can read.
`auto` takes `memory` where the engine allows it.

At each push every older adapter is retired. The engine removes one only once no running request uses it: with
async rollouts a generation call may still run on the previous adapter when the next one arrives (a request keeps
the adapter it started with). So at most three are held at once: the one a running call uses, the one the push
retires, the new one; vLLM keeps `max_loras` of them on the device and one more in its host cache, so none in use is
ever evicted (an adapter built from memory has no folder to be read back from).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import torch

from grpo_pipe.bridges.contract import sync_every_rule
from grpo_pipe.bridges.shared_memory import SharedBuckets, map_buckets
from grpo_pipe.config.errors import failed
from grpo_pipe.interfaces import AdapterEngine, AdapterPolicy, MemoryAdapterEngine
from grpo_pipe.models.files import folder_bytes, replace_atomically
from grpo_pipe.rollout.adapter_leases import IN_MEMORY_PREFIX
from grpo_pipe.rollout.worker_extension import EngineWorker, worker_extension
from grpo_pipe.runtime import env
from grpo_pipe.transport.collective import plan_buckets
from grpo_pipe.types import SyncStats

TRANSPORTS = ("auto", "memory", "folder")


class AdapterTransport(Protocol):
    """How one adapter version reaches the engine and becomes servable there."""

    def send(self, policy: AdapterPolicy, name: str, version: int) -> tuple[float, int]:
        """Hand the policy's adapter to the engine as `version`, serve it; returns (seconds until the engine
        took over, bytes moved).

        Args:
            policy: The trained policy whose adapter weights are sent.
            name: The adapter's name in the engine.
            version: The policy version the adapter is served as.
        """
        ...

    def forget(self, version: int) -> None:
        """Drop what this transport kept for an adapter the engine no longer serves.

        Args:
            version: The adapter version no longer served.
        """

    def close(self) -> None: ...


class MemoryTransport:
    """One flat buffer in the engine's dtype that the engine's worker mapped once; the worker builds each
    adapter from it through vLLM's `add_lora`.

    Args:
        engine: The engine on this machine whose worker maps the buffer and builds each adapter from it.
        policy: The trained policy: its adapter's tensors size the buffer, its adapter config goes to the worker.
    """

    def __init__(self, engine: MemoryAdapterEngine, policy: AdapterPolicy) -> None:
        self.engine = engine
        tensors = policy.adapter_tensors()
        shapes = [(name, torch.empty(t.shape, dtype=engine.weight_dtype, device="meta")) for name, t in tensors.items()]
        device = next(iter(tensors.values())).device
        self.buffer = SharedBuckets(plan_buckets(shapes, bucket_bytes=2**62), device)  # one buffer: a few MB
        engine.call_workers("grpo_map_adapter", self.buffer.handles(), self.buffer.wire_plan(), policy.adapter_config(),
                            changes_weights=False)

    def send(self, policy: AdapterPolicy, name: str, version: int) -> tuple[float, int]:
        started = time.perf_counter()
        self.buffer.fill(policy.adapter_tensors().values())
        written = time.perf_counter()
        self.engine.call_workers("grpo_add_adapter", name, version, changes_weights=False)
        self.engine.serve_adapter(name, version)
        return written - started, self.buffer.nbytes

    def forget(self, version: int) -> None:
        """The engine's copy is all there is: nothing kept here."""

    def close(self) -> None:
        if self.engine.is_running():
            self.engine.call_workers("grpo_unmap_adapter", changes_weights=False)
        self.buffer.close()


class FolderTransport:
    """peft's adapter folder, written where the engine can read it (RAM-backed where possible) and loaded by path.

    Args:
        engine: The engine that loads each adapter folder by path.
    """

    def __init__(self, engine: AdapterEngine) -> None:
        self.engine = engine
        self.root = Path(tempfile.mkdtemp(prefix="grpo_pipe-lora-", dir=env.fast_scratch_dir()))

    def send(self, policy: AdapterPolicy, name: str, version: int) -> tuple[float, int]:
        started = time.perf_counter()
        folder, tmp = self.root / f"v{version}", self.root / f".v{version}.tmp"
        policy.save_adapter(tmp, dtype=self.engine.weight_dtype)
        replace_atomically(tmp, folder)
        written = time.perf_counter()
        self.engine.use_adapter(name, version, folder)
        return written - started, folder_bytes(folder)

    def forget(self, version: int) -> None:
        shutil.rmtree(self.root / f"v{version}", ignore_errors=True)

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


class LoraHotSwapBridge:
    """`weight_bridge=lora`: at each sync the running engine switches to the newly trained adapter; the base never moves.

    Args:
        sync_every: Optimizer steps between syncs.
        max_lora_rank: The rank vLLM allocates adapter slots of (the policy's `rank` by default).
        max_loras: Adapters on the device at once: the one running requests use and the new one (at least 2).
        transport: `memory` (a shared buffer, no files: an engine on this machine), `folder` (adapter files: any
            engine) or `auto` (`memory` where the engine allows it).
    """

    def __init__(self, *, sync_every: int = 1, max_lora_rank: int = 16, max_loras: int = 2, transport: str = "auto") -> None:
        self.sync_every = sync_every
        self.max_lora_rank = max_lora_rank
        self.max_loras = max_loras
        self.transport = transport
        self.engine: AdapterEngine | None = None
        self._transport: AdapterTransport | None = None  # chosen at connect: `auto` depends on the engine
        self._live: list[int] = []  # adapter ids loaded in the engine, oldest first

    def config_problems(self) -> list[str]:
        return failed(
            sync_every_rule(self.sync_every),
            (self.max_loras >= 2, f"weight_bridge.max_loras={self.max_loras}: must be >= 2 (the old and the new adapter)"),
            (self.transport in TRANSPORTS,
             f"weight_bridge.transport={self.transport!r}: must be one of {', '.join(TRANSPORTS)}"),
        )

    @staticmethod
    def _memory_capable(engine: object) -> bool:
        # CUDA IPC maps memory of another process only: a GPU engine in this process takes the folder.
        return (isinstance(engine, MemoryAdapterEngine) and engine.device_ids is None
                and not (engine.in_process and engine.on_gpu))

    def check(self, engine: object, policy: object) -> list[str]:
        problems: list[str] = []
        if not isinstance(engine, AdapterEngine):
            problems.append(f"weight_bridge=lora needs an engine that serves LoRA adapters, got {type(engine).__name__}")
        elif self.transport == "memory" and not self._memory_capable(engine):
            problems.append(
                "weight_bridge.transport=memory needs a vLLM engine (rollout=vllm) that shares the trainer's device "
                "(rollout.layout.device_ids=null) and, on a GPU, runs in its own process (rollout.layout.in_process=false); "
                "use weight_bridge.transport=folder or auto"
            )
        if not isinstance(policy, AdapterPolicy):
            problems.append(f"weight_bridge=lora needs policy=lora, got {type(policy).__name__}")
        elif policy.rank > self.max_lora_rank:
            problems.append(f"policy.rank={policy.rank} > weight_bridge.max_lora_rank={self.max_lora_rank}")
        return problems

    def engine_options(self) -> dict[str, Any]:
        return {"enable_lora": True, "max_lora_rank": self.max_lora_rank, "max_loras": self.max_loras,
                "max_cpu_loras": self.max_loras + 1,  # the new adapter arrives before the retired one leaves
                **worker_extension(AdapterReceiver)}

    def connect(self, engine: AdapterEngine, policy: AdapterPolicy) -> None:
        self.engine = engine
        if self.transport != "folder" and self._memory_capable(engine):
            assert isinstance(engine, MemoryAdapterEngine)  # what _memory_capable checked
            self._transport = MemoryTransport(engine, policy)
        else:
            self._transport = FolderTransport(engine)

    def push(self, policy: AdapterPolicy, version: int) -> SyncStats:
        if self._transport is None:
            raise RuntimeError("bridge used before connect()")
        started = time.perf_counter()
        transport_s, nbytes = self._transport.send(policy, f"policy-v{version}", version)
        loaded = time.perf_counter()
        self._retire_all_but(version)
        return SyncStats(gather_s=0.0, transport_s=transport_s, load_s=loaded - started - transport_s,
                         pause_s=loaded - started, bytes_moved=nbytes, policy_version=version)

    def _retire_all_but(self, version: int) -> None:
        assert self._transport is not None and self.engine is not None
        for old in self._live:
            self.engine.retire_adapter(old)
            self._transport.forget(old)
        self._live = [version]

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
        self.engine, self._transport, self._live = None, None, []


class AdapterReceiver(EngineWorker):
    """The engine side of `lora` from memory: map the trainer's adapter buffer once, build each new adapter from it."""

    def grpo_map_adapter(self, handles: list[dict[str, Any]], wire_plan: list[dict[str, Any]], config: dict[str, Any]) -> None:
        """Map the trainer's adapter buffer and keep peft's adapter config (once per connect); refuses
        an adapter on modules this engine cannot apply LoRA to, as vLLM's folder loader would."""
        flats, views = map_buckets(handles, wire_plan)
        unexpected = _unexpected_modules(self, [name for name, _ in views])
        if unexpected:
            raise ValueError(f"this engine cannot apply LoRA to {unexpected[:5]} ({len(unexpected)} adapter tensors)")
        self._grpo_adapter_flats, self._grpo_adapter, self._grpo_adapter_config = flats, views, config

    def grpo_add_adapter(self, name: str, adapter_id: int) -> dict[str, float]:
        """Register the adapter now in the mapped buffer as `adapter_id`. Its tensors are copied out first:
        the trainer refills the buffer at the next sync while this adapter may still serve requests."""
        started = time.perf_counter()
        tensors = {n: t.clone() for n, t in self._grpo_adapter}
        _add_adapter(self, name, adapter_id, tensors, self._grpo_adapter_config)
        if self._grpo_adapter and self._grpo_adapter[0][1].is_cuda:
            torch.cuda.synchronize()  # the copies out of the buffer are done before the trainer refills it
        return {"load_s": time.perf_counter() - started}

    def grpo_unmap_adapter(self) -> None:
        for attr in ("_grpo_adapter", "_grpo_adapter_flats", "_grpo_adapter_config"):
            if hasattr(self, attr):
                delattr(self, attr)


# -- inside the worker: adapters built from tensors it already holds (no adapter folder) --------------------------
# vLLM's own adapter loading reads a folder (`adapter_config.json` + safetensors). Everything after the read is vLLM's:
# the same config check, name mapping and `LoRAModel.from_lora_tensors` its folder loader ends in, and its own
# `add_lora` (cache, eviction, activation into the GPU slots); only where the tensors come from differs. `manager` is
# the worker's LoRA manager (vLLM's `LRUCacheWorkerLoRAManager`); `worker` is vLLM's worker object.


def _manager(worker: Any) -> Any:
    manager = getattr(worker.model_runner, "lora_manager", None)
    if manager is None:
        raise RuntimeError("the engine was started without LoRA (enable_lora)")
    return manager


def _expected_modules(manager: Any) -> set[str]:
    """Module names an adapter may target in this model, as vLLM's folder loader computes them."""
    adapters = manager._adapter_manager
    expected: set[str] = set()
    for module in adapters.supported_lora_modules:
        expected.update(adapters.packed_modules_mapping.get(module, [module]))
    return expected


def _unexpected_modules(worker: Any, names: Sequence[str]) -> list[str]:
    """Adapter tensor names whose module this engine cannot apply LoRA to (vLLM's folder loader refuses them)."""
    from vllm.lora.utils import parse_fine_tuned_lora_name

    expected = _expected_modules(_manager(worker))
    return [n for n in names if parse_fine_tuned_lora_name(n)[0].rsplit(".", 1)[-1] not in expected]


def _weights_mapper(model: Any) -> Any:
    mapper = getattr(model, "hf_to_vllm_mapper", None)
    if mapper is None:
        return None
    # The renames only (qkv / gate_up packing is the LoRA manager's job); vLLM renamed this method in 0.27.
    unstack = getattr(mapper, "get_unstacked_mapper", None) or mapper.get_rename_mapper
    return unstack()


def _adapter_from_tensors(manager: Any, adapter_id: int, tensors: dict[str, torch.Tensor], config: dict[str, Any]) -> Any:
    """vLLM's `LoRAModel` for peft-named `tensors` and peft's adapter `config` (what adapter_config.json holds)."""
    from vllm.lora.peft_helper import PEFTHelper

    peft_helper: Any = PEFTHelper  # vLLM leaves from_dict's argument untyped
    helper = peft_helper.from_dict({**config, "vllm_max_position_embeddings": manager.max_position_embeddings})
    helper.validate_legal(manager.lora_config)
    model = manager._adapter_manager.model
    device = next(iter(tensors.values())).device
    return manager._lora_model_cls.from_lora_tensors(
        adapter_id, tensors, helper, device=str(device), dtype=manager.lora_config.lora_dtype,
        model_vocab_size=manager.vocab_size, weights_mapper=_weights_mapper(model),
        skip_prefixes=getattr(model, "lora_skip_prefixes", None),
    )


def _add_adapter(worker: Any, name: str, adapter_id: int, tensors: dict[str, torch.Tensor], config: dict[str, Any]) -> None:
    """Register the adapter under `adapter_id` through vLLM's own `add_lora`; requests then name it with
    `LoRARequest(name, adapter_id, IN_MEMORY_PREFIX + name)`."""
    from vllm.lora.request import LoRARequest

    manager = _manager(worker)
    request = LoRARequest(lora_name=name, lora_int_id=adapter_id, lora_path=IN_MEMORY_PREFIX + name)

    def build(_request: Any) -> Any:  # what vLLM's manager calls instead of reading a folder
        return _adapter_from_tensors(manager, adapter_id, tensors, config)

    manager._load_adapter = build  # an instance attribute, for this call only: the class's method is untouched
    try:
        worker.add_lora(request)
    finally:
        del manager._load_adapter
