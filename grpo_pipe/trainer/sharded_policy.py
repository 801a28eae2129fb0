"""The sharded trainer's policy as the weight bridges and the best/final export see it.

For exports and the bridges that read files or tensors here, weights are gathered unsharded on rank 0 and reach
this process through Ray, so they work the same whether the ranks run on this machine or on others. The `nccl`
bridge does not take that road: rank 0 joins its group and broadcasts from its GPU (`SendingPolicy`). A LoRA policy is merged here
(W + B A * alpha / r, peft's formula without rsLoRA or DoRA, which the LoRA policy does not use).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import torch

_BASE = "base_model.model."  # peft's prefix before the transformers module names
_HF_FILES = ("config.json", "generation_config.json")


class _Ranks(Protocol):
    @property
    def model_path(self) -> Path | None: ...

    @property
    def tie_word_embeddings(self) -> bool: ...

    def collect(self, method: str, *args: Any) -> Any:
        """Call `method` on every rank and gather what they return.

        Args:
            method: The rank's method to call.
            *args: Its arguments, the same on every rank.
        """
        ...


class ShardedPolicy:
    """A handle to the policy the ranks hold. `inner` is the policy's config object (never loaded here).

    Args:
        ranks: The ranks that hold the policy, asked through collective calls.
        inner: The policy's config object (its LoRA rank and alpha are read from it).
    """

    def __init__(self, ranks: _Ranks, inner: Any) -> None:
        self.ranks = ranks
        self.inner = inner
        self.module = None  # the model lives on the ranks

    @property
    def is_lora(self) -> bool:
        return hasattr(self.inner, "save_adapter")

    @property
    def rank(self) -> int:
        """LoRA rank (the lora bridge checks it against the engine's limit)."""
        return int(self.inner.rank)

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full-model weights under Hugging Face checkpoint names (LoRA merged); a tied lm_head only once."""
        state = self.ranks.collect("full_state", "weights")
        merged = merge_lora(state, float(self.inner.alpha) / float(self.inner.rank)) if self.is_lora else state
        for name, tensor in merged.items():
            if self.ranks.tie_word_embeddings and name == "lm_head.weight":
                continue
            yield name, tensor

    # A bridge's sending rank (`SendingPolicy`): rank 0 broadcasts from its GPU, the other ranks help it gather.
    @property
    def sends_own_weights(self) -> bool:
        return not self.is_lora  # an adapter is merged into its base here, from `named_weights`

    def weight_specs(self) -> list[tuple[str, tuple[int, ...]]]:
        return [(name, tuple(shape)) for name, shape in self.ranks.collect("weight_specs")]

    def open_weight_group(self, backend: str, host: str, port: int, timeout_s: float, world_size: int) -> None:
        self.ranks.collect("open_weight_group", backend, host, port, timeout_s, world_size)

    def broadcast_weights(self, wire_plan: list[dict[str, Any]]) -> dict[str, float]:
        return dict(self.ranks.collect("broadcast_weights", wire_plan))

    def close_weight_group(self) -> None:
        self.ranks.collect("close_weight_group")

    def save_pretrained(self, path: Path, dtype: torch.dtype | None = None) -> None:
        """A plain Hugging Face folder (config + safetensors) that vLLM or transformers load."""
        from safetensors.torch import save_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        state = {k: v.to(dtype or v.dtype).contiguous() for k, v in self.named_weights()}
        save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
        source = self.ranks.model_path
        if source is None:
            raise RuntimeError("policy exported before the trainer's setup()")
        for name in _HF_FILES:
            if (Path(source) / name).exists():
                shutil.copyfile(Path(source) / name, path / name)

    def save_adapter(self, path: Path, dtype: torch.dtype | None = None) -> None:
        """The LoRA adapter in peft's folder format, from rank 0."""
        from safetensors.torch import save_file

        config, tensors = self.ranks.collect("adapter")
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        (path / "adapter_config.json").write_text(json.dumps(_jsonable(config), indent=1))
        state = {k: v.to(dtype or v.dtype).contiguous() for k, v in tensors.items()}
        save_file(state, str(path / "adapter_model.safetensors"), metadata={"format": "pt"})


def merge_lora(state: dict[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
    """A peft model's full state -> the merged base model's, under transformers names."""
    merged: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if ".lora_" in name:
            continue
        plain = name.removeprefix(_BASE).replace(".base_layer", "")
        if ".base_layer.weight" in name:
            stem = name.removesuffix(".base_layer.weight")
            a, b = state[f"{stem}.lora_A.default.weight"], state[f"{stem}.lora_B.default.weight"]  # [r, in], [out, r]
            tensor = (tensor.float() + (b.float() @ a.float()) * scale).to(tensor.dtype)  # [out, in]
        merged[plain] = tensor
    return merged


def _jsonable(value: Any) -> Any:
    """peft's config dict holds sets and enums; JSON wants lists and strings."""
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (set, list, tuple)):
        return [_jsonable(v) for v in sorted(value, key=str)] if isinstance(value, set) else [_jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(getattr(value, "value", value))
