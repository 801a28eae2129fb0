"""Single-copy weights on one GPU (`weight_bridge=ipc`): the trainer's parameters ARE the engine's.

At connect, the engine's worker exports its weight storage (CUDA IPC handles: the engine runs in its
own process, as on a GPU by default) and every trainer parameter is re-pointed at the matching
storage: fused engine tensors (qkv_proj, gate_up_proj) are shared as row slices, a tied lm_head comes
along with the embedding. The trainer's own copy is then freed, so the GPU holds one copy of the
weights. The optimizer updates them in place; a "sync" moves no bytes: it waits for the optimizer's
writes and bumps the served version (new requests get a fresh prefix-cache namespace, so no KV block
computed with older weights is reused). An in-process engine hands over its tensors directly.

Generation and optimisation alternate in this loop, so generation is paused while the optimizer
writes. Needs a policy in the engine's dtype (training is then bf16 without fp32 master weights, the
usual trade of single-copy designs) and no sleep mode (sleeping would take the trainer's weights away).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import torch

from grpo_pipe.bridges.contract import sync_every_rule
from grpo_pipe.bridges.shared_memory import cuda_handle, engine_views, open_handle
from grpo_pipe.config.errors import failed
from grpo_pipe.interfaces import AdapterPolicy, LocalEngine, ModulePolicy, Policy
from grpo_pipe.rollout.worker_extension import EngineWorker, worker_extension
from grpo_pipe.types import SyncStats


def _engine_model(worker: Any) -> Any:
    return worker.model_runner.model


class CudaIpcBridge:
    """`weight_bridge=ipc`: the trainer's parameters are the engine's (one copy on the GPU); a sync moves no bytes.

    Args:
        sync_every: Optimizer steps between syncs (each waits for the optimizer's writes and bumps the served version).
    """

    def __init__(self, sync_every: int = 1) -> None:
        self.sync_every = sync_every
        self.engine: LocalEngine | None = None
        self.shared_bytes = 0
        self._engine_tensors: dict[str, torch.Tensor] = {}  # keeps the mapped engine storage open

    def config_problems(self) -> list[str]:
        return failed(sync_every_rule(self.sync_every))

    def check(self, engine: object, policy: object) -> list[str]:
        problems: list[str] = []
        if not torch.cuda.is_available():
            problems.append(
                "weight_bridge=ipc needs a CUDA GPU (trainer and engine share one copy of the weights in GPU "
                "memory); on this machine use weight_bridge=reload, lora, nccl or checkpoint"
            )
        if not isinstance(engine, LocalEngine) or engine.device_ids is not None:
            problems.append(
                "weight_bridge=ipc needs a vLLM engine on the trainer's GPU (placement=colocated, "
                "rollout.layout.device_ids=null)"
            )
        elif engine.enable_sleep_mode:
            problems.append(
                "weight_bridge=ipc cannot use rollout.memory.enable_sleep_mode=true: a sleeping engine would free the "
                "trainer's weights"
            )
        if not isinstance(policy, ModulePolicy) or isinstance(policy, AdapterPolicy):
            problems.append(f"weight_bridge=ipc needs policy=full, got {type(policy).__name__}")
        return problems

    def engine_options(self) -> dict[str, Any]:
        return worker_extension(WeightExporter)

    def connect(self, engine: LocalEngine, policy: ModulePolicy) -> None:
        module = policy.module
        if module is None:
            raise RuntimeError("policy must be loaded before the ipc bridge connects")
        engine_params, packed = self._engine_weights(engine)
        self._engine_tensors = engine_params
        trainer_params = dict(module.named_parameters(remove_duplicate=False))
        views = engine_views(engine_params, trainer_params, packed)
        with torch.no_grad():
            self._alias(trainer_params, views)
        self.shared_bytes = sum(p.numel() * p.element_size() for p in {id(p): p for p in module.parameters()}.values())
        torch.cuda.synchronize()  # the engine reads the weights copied in above from its own process
        torch.cuda.empty_cache()
        engine.after_external_weight_update()
        self.engine = engine

    @staticmethod
    def _engine_weights(engine: LocalEngine) -> tuple[dict[str, torch.Tensor], dict[str, list[str]]]:
        """The engine's parameters as tensors of this process, and vLLM's fused-module mapping."""
        if engine.in_process:
            model = engine.call_workers_in_process(_engine_model)
            return dict(model.named_parameters(remove_duplicate=False)), dict(getattr(model, "packed_modules_mapping", {}))
        exported = engine.call_workers("grpo_export_weights")[0]
        return {name: open_handle(h) for name, h in exported["params"].items()}, exported["packed"]

    def engine_storage_spans(self) -> list[tuple[int, int]]:
        """(first, last + 1) device address of each engine tensor this bridge maps: where the trainer's
        parameters must live."""
        return [(t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in self._engine_tensors.values()]

    @staticmethod
    def _alias(trainer_params: Mapping[str, torch.nn.Parameter], views: Mapping[str, torch.Tensor]) -> None:
        for name, param in trainer_params.items():
            view = views[name]
            if view.dtype != param.dtype or view.shape != param.shape or view.device != param.device:
                raise RuntimeError(
                    f"weight_bridge=ipc: {name} is {param.dtype}{tuple(param.shape)} on {param.device} in the trainer "
                    f"but {view.dtype}{tuple(view.shape)} on {view.device} in the engine; set trainer.precision.dtype to "
                    "the engine's"
                )
            view.copy_(param.data)  # the engine starts from exactly the trainer's weights
            param.data = view  # share storage; the trainer's own tensor is freed here

    def push(self, policy: Policy, version: int) -> SyncStats:
        if self.engine is None:
            raise RuntimeError("bridge used before connect()")
        started = time.perf_counter()
        torch.cuda.synchronize()  # the optimizer's in-place writes are done before generation resumes
        self.engine.after_external_weight_update()
        elapsed = time.perf_counter() - started
        return SyncStats(gather_s=0.0, transport_s=0.0, load_s=0.0, pause_s=elapsed, bytes_moved=0, policy_version=version)

    def close(self) -> None:
        self.engine = None
        self._engine_tensors = {}


class WeightExporter(EngineWorker):
    """The engine side of `ipc`: hand out CUDA IPC handles to the engine's own weight storage."""

    def grpo_export_weights(self) -> dict[str, Any]:
        """CUDA IPC handles to every parameter of the engine's model, and how vLLM fused them."""
        model = self.model_runner.model
        params = {name: cuda_handle(p.data) for name, p in model.named_parameters(remove_duplicate=False)}
        return {"params": params, "packed": {k: list(v) for k, v in getattr(model, "packed_modules_mapping", {}).items()}}
