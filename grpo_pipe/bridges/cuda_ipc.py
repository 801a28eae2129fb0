"""Single-copy weights on one GPU (`weight_bridge=ipc`): the trainer's parameters ARE the engine's.

At connect, every trainer parameter is re-pointed at the matching storage inside the live vLLM
model: fused engine tensors (qkv_proj, gate_up_proj) are shared as row slices, a tied lm_head comes
along with the embedding. The trainer's own copy is then freed, so the GPU holds one copy of the
weights. The optimizer updates them in place; a "sync" moves no bytes: it only resets the engine's
prefix cache (KV blocks computed with older weights) and bumps the served version.

Generation and optimisation alternate in this loop, so generation is paused while the optimizer
writes. Needs an in-process engine (V1 with multiprocessing off) and a policy in the engine's dtype;
training is then bf16 without fp32 master weights, the usual trade of single-copy designs.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import torch

from grpo_pipe.bridges.contract import check_sync_every
from grpo_pipe.rollout.vllm_engine import VllmEngine
from grpo_pipe.trainer.policy import FullFinetunePolicy
from grpo_pipe.types import SyncStats


def engine_views(engine_params: Mapping[str, torch.Tensor], trainer_params: Mapping[str, torch.Tensor],
                 packed: Mapping[str, list[str]]) -> dict[str, torch.Tensor]:
    """For each trainer parameter name, the view of engine storage that holds it.

    `packed` is vLLM's `packed_modules_mapping` (e.g. qkv_proj -> [q_proj, k_proj, v_proj]): shards
    are stacked along dim 0 in that order, so offsets follow the trainer's own shard shapes.
    """
    views: dict[str, torch.Tensor] = {}
    for name, tensor in trainer_params.items():
        if name in engine_params:
            views[name] = engine_params[name]
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
        raise RuntimeError(f"weight_bridge=ipc: no engine storage for {missing[:5]} (of {len(missing)})")
    return views


def _engine_model(worker: Any) -> Any:
    return worker.model_runner.model


class CudaIpcBridge:
    def __init__(self, sync_every: int = 1) -> None:
        self.sync_every = check_sync_every(sync_every)
        self.engine: VllmEngine | None = None
        self.shared_bytes = 0

    def check(self, engine: object, policy: object) -> list[str]:
        problems = []
        if not torch.cuda.is_available():
            problems.append(
                "weight_bridge=ipc needs a CUDA GPU (trainer and engine share one copy of the weights in GPU "
                "memory); on this machine use weight_bridge=reload, lora, nccl or checkpoint"
            )
        if not isinstance(engine, VllmEngine) or not engine.in_process:
            problems.append("weight_bridge=ipc needs an in-process vLLM engine (placement=colocated, rollout.in_process=true)")
        if not isinstance(policy, FullFinetunePolicy):
            problems.append(f"weight_bridge=ipc needs policy=full, got {type(policy).__name__}")
        return problems

    def engine_options(self) -> dict[str, Any]:
        return {}

    def connect(self, engine: VllmEngine, policy: FullFinetunePolicy) -> None:
        module = policy.module
        if module is None:
            raise RuntimeError("policy must be loaded before the ipc bridge connects")
        model = engine.call_workers_in_process(_engine_model)
        engine_params = dict(model.named_parameters(remove_duplicate=False))
        trainer_params = dict(module.named_parameters(remove_duplicate=False))
        views = engine_views(engine_params, trainer_params, getattr(model, "packed_modules_mapping", {}))
        with torch.no_grad():
            self._alias(trainer_params, views)
        self.shared_bytes = sum(p.numel() * p.element_size() for p in {id(p): p for p in module.parameters()}.values())
        torch.cuda.empty_cache()
        engine.after_external_weight_update()
        self.engine = engine

    @staticmethod
    def _alias(trainer_params: Mapping[str, torch.nn.Parameter], views: Mapping[str, torch.Tensor]) -> None:
        for name, param in trainer_params.items():
            view = views[name]
            if view.dtype != param.dtype or view.shape != param.shape or view.device != param.device:
                raise RuntimeError(
                    f"weight_bridge=ipc: {name} is {param.dtype}{tuple(param.shape)} on {param.device} in the trainer "
                    f"but {view.dtype}{tuple(view.shape)} on {view.device} in the engine; set trainer.dtype to the engine's"
                )
            view.copy_(param.data)  # the engine starts from exactly the trainer's weights
            param.data = view  # share storage; the trainer's own tensor is freed here

    def push(self, policy: Any, version: int) -> SyncStats:
        if self.engine is None:
            raise RuntimeError("bridge used before connect()")
        started = time.perf_counter()
        torch.cuda.synchronize()  # the optimizer's in-place writes are done before generation resumes
        self.engine.after_external_weight_update()
        elapsed = time.perf_counter() - started
        return SyncStats(gather_s=0.0, transport_s=0.0, load_s=0.0, pause_s=elapsed, bytes_moved=0, policy_version=version)

    def close(self) -> None:
        self.engine = None
