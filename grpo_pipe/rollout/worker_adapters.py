"""LoRA adapters built inside a vLLM worker from tensors it already holds (no adapter folder): the
engine half of `weight_bridge=lora` with `transport: memory`. `manager` is the worker's LoRA manager
(vLLM's `LRUCacheWorkerLoRAManager`); `worker` is vLLM's worker object.

vLLM's own adapter loading reads a folder (`adapter_config.json` + safetensors). Everything after
the read is vLLM's: the same config check, name mapping and `LoRAModel.from_lora_tensors` its folder
loader ends in, and its own `add_lora` (cache, eviction, activation into the GPU slots); only where
the tensors come from differs.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

IN_MEMORY_PREFIX = "in-memory:"  # the LoRARequest path of an adapter built here; no folder exists


def _manager(worker: Any) -> Any:
    manager = getattr(worker.model_runner, "lora_manager", None)
    if manager is None:
        raise RuntimeError("the engine was started without LoRA (enable_lora)")
    return manager


def expected_modules(manager: Any) -> set[str]:
    """Module names an adapter may target in this model, as vLLM's folder loader computes them."""
    adapters = manager._adapter_manager
    expected: set[str] = set()
    for module in adapters.supported_lora_modules:
        expected.update(adapters.packed_modules_mapping.get(module, [module]))
    return expected


def unexpected_modules(worker: Any, names: Sequence[str]) -> list[str]:
    """Adapter tensor names whose module this engine cannot apply LoRA to (vLLM's folder loader refuses them)."""
    from vllm.lora.utils import parse_fine_tuned_lora_name

    expected = expected_modules(_manager(worker))
    return [n for n in names if parse_fine_tuned_lora_name(n)[0].rsplit(".", 1)[-1] not in expected]


def _weights_mapper(model: Any) -> Any:
    mapper = getattr(model, "hf_to_vllm_mapper", None)
    if mapper is None:
        return None
    # The renames only (qkv / gate_up packing is the LoRA manager's job); vLLM renamed this method in 0.27.
    unstack = getattr(mapper, "get_unstacked_mapper", None) or mapper.get_rename_mapper
    return unstack()


def adapter_from_tensors(manager: Any, adapter_id: int, tensors: dict[str, torch.Tensor], config: dict[str, Any]) -> Any:
    """vLLM's `LoRAModel` for peft-named `tensors` and peft's adapter `config` (what adapter_config.json holds)."""
    from vllm.lora.peft_helper import PEFTHelper

    helper = PEFTHelper.from_dict({**config, "vllm_max_position_embeddings": manager.max_position_embeddings})
    helper.validate_legal(manager.lora_config)
    model = manager._adapter_manager.model
    device = next(iter(tensors.values())).device
    return manager._lora_model_cls.from_lora_tensors(
        adapter_id, tensors, helper, device=str(device), dtype=manager.lora_config.lora_dtype,
        model_vocab_size=manager.vocab_size, weights_mapper=_weights_mapper(model),
        skip_prefixes=getattr(model, "lora_skip_prefixes", None),
    )


@contextmanager
def loading_from(manager: Any, build: Any) -> Iterator[None]:
    """While open, vLLM's adapter manager builds adapters with `build(request)` instead of reading a folder."""
    manager._load_adapter = build  # an instance attribute: the class's method is untouched
    try:
        yield
    finally:
        del manager._load_adapter


def add_adapter(worker: Any, name: str, adapter_id: int, tensors: dict[str, torch.Tensor], config: dict[str, Any]) -> None:
    """Register the adapter under `adapter_id` through vLLM's own `add_lora`; requests then name it with
    `LoRARequest(name, adapter_id, IN_MEMORY_PREFIX + name)`."""
    from vllm.lora.request import LoRARequest

    manager = _manager(worker)
    request = LoRARequest(lora_name=name, lora_int_id=adapter_id, lora_path=IN_MEMORY_PREFIX + name)
    with loading_from(manager, lambda req: adapter_from_tensors(manager, req.lora_int_id, tensors, config)):
        worker.add_lora(request)
