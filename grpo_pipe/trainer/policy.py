"""Trainable policies: a full fine-tune, or a peft LoRA adapter on a frozen base.

Both expose the same surface to the trainer (`module`, `trainable_parameters`, the frozen reference
for a KL penalty) and to the weight bridges (`named_weights`: full-model weights under Hugging Face
checkpoint names).

The KL reference costs memory only for a full fine-tune: one more copy of the weights in the trainer's
dtype (no gradients, no optimizer state; e.g. +0.5 GB for a 135M model in fp32, +3 GB for 1.5B in bf16).
A LoRA policy's reference is its own base with the adapter switched off: no copy, one extra forward.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from grpo_pipe.models.custom_code import loader_options

if TYPE_CHECKING:
    from peft import PeftModel
    from transformers import PreTrainedModel


def _load_causal_lm(model_path: Path, device: torch.device, dtype: torch.dtype) -> PreTrainedModel:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype, **loader_options(model_path))
    # transformers' `to` carries functools.wraps(nn.Module.to), which a type checker reads as unbound;
    # through the base type the call is the same (it moves the model in place and returns it).
    cast(torch.nn.Module, model).to(device)
    return model


def hf_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """state_dict entries under checkpoint names; a tied lm_head is included only as the embedding."""
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    for name, tensor in model.state_dict().items():
        if tied and name == "lm_head.weight":
            continue
        yield name, tensor.detach()


class FullFinetunePolicy:
    """Every weight of the causal LM is trained.

    Args:
        gradient_checkpointing: Recompute activations in the backward pass: less memory, more compute.
    """

    def __init__(self, gradient_checkpointing: bool = False) -> None:
        self.gradient_checkpointing = gradient_checkpointing
        self.module: torch.nn.Module | None = None
        self._reference: torch.nn.Module | None = None

    def load(self, model_path: Path, device: torch.device, dtype: torch.dtype) -> None:
        module = _load_causal_lm(model_path, device, dtype)
        self._reference = None
        if self.gradient_checkpointing:
            module.gradient_checkpointing_enable()
        module.train()
        self.module = module

    def keep_reference(self) -> None:
        """A frozen copy of the weights as they are now (the starting policy), for the KL penalty."""
        self._reference = copy.deepcopy(self._module()).eval().requires_grad_(False)

    def reference_logits(self, inputs: Mapping[str, Any]) -> torch.Tensor:
        """The starting weights' logits for these forward arguments (as the trainer calls `module`)."""
        if self._reference is None:
            raise RuntimeError("reference_logits() before keep_reference()")
        with torch.no_grad():
            return self._reference(**inputs).logits

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self._module().parameters() if p.requires_grad]

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        return hf_weights(self._module())

    def save_pretrained(self, path: Path, dtype: torch.dtype | None = None) -> None:
        module = self._module()
        state = None if dtype is None else {k: v.to(dtype) for k, v in hf_weights(module)}
        module.save_pretrained(path, state_dict=state, safe_serialization=True)

    def _module(self) -> PreTrainedModel:
        if self.module is None:
            raise RuntimeError("policy used before load()")
        return cast("PreTrainedModel", self.module)  # what `load` put there


class LoraPolicy:
    """A peft LoRA adapter trained on a frozen base model.

    Args:
        rank: The adapter's rank (the `lora` bridge sizes the engine's adapter slots from it).
        alpha: peft's `lora_alpha`: the adapter's update is scaled by `alpha / rank`.
        dropout: peft's `lora_dropout` on the adapter's input.
        target_modules: The modules that get an adapter (attention and MLP projections by default).
        gradient_checkpointing: Recompute activations in the backward pass: less memory, more compute.
    """

    def __init__(
        self,
        *,
        rank: int = 16,
        alpha: float = 32.0,
        dropout: float = 0.0,
        target_modules: Sequence[str] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
        gradient_checkpointing: bool = False,
    ) -> None:
        self.rank = rank
        self.alpha = alpha
        self.dropout = dropout
        self.target_modules = list(target_modules)
        self.gradient_checkpointing = gradient_checkpointing
        self.module: torch.nn.Module | None = None
        self._adapter_tensors: dict[str, torch.Tensor] | None = None  # saved name -> the live parameter's data

    def load(self, model_path: Path, device: torch.device, dtype: torch.dtype) -> None:
        from peft import LoraConfig, get_peft_model

        self._adapter_tensors = None
        base = _load_causal_lm(model_path, device, dtype)
        if self.gradient_checkpointing:
            base.gradient_checkpointing_enable()
            base.enable_input_require_grads()
        config = LoraConfig(
            r=self.rank,
            # peft annotates lora_alpha as int, but only divides by it (scaling = lora_alpha / r); a float
            # keeps `policy.alpha: 32.0` (the yaml default, and every saved run config) valid.
            lora_alpha=self.alpha,  # pyright: ignore[reportArgumentType]
            lora_dropout=self.dropout,
            target_modules=self.target_modules,
            task_type="CAUSAL_LM",
        )
        module = get_peft_model(base, config)
        module.train()
        self.module = module

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self._module().parameters() if p.requires_grad]

    def keep_reference(self) -> None:
        """Nothing to keep: the frozen base with the adapter switched off is the starting policy."""

    def reference_logits(self, inputs: Mapping[str, Any]) -> torch.Tensor:
        """The base's logits (adapter off) for these forward arguments (as the trainer calls `module`)."""
        module = self._module()
        with torch.no_grad(), module.disable_adapter():
            return module(**inputs).logits

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Base weights with the adapter merged in, for bridges that load full weights.

        Merging is done in place and undone before returning, so the copies are taken while merged.
        """
        module = self._module()
        module.merge_adapter()
        try:
            merged = [
                (k.replace(".base_layer", ""), v.clone())
                for k, v in hf_weights(module.get_base_model())
                if "lora_" not in k
            ]
        finally:
            module.unmerge_adapter()
        return iter(merged)

    def save_adapter(self, path: Path, dtype: torch.dtype | None = None) -> None:
        """The adapter in peft's folder format: adapter_config.json + adapter_model.safetensors.

        Written directly (not through `save_pretrained`, which also renders a model card): this runs
        on every LoRA sync, so its cost is sync latency. `dtype`: cast to what the engine computes in
        (it would cast on load, to the same values), so an fp32 trainer writes half the bytes for a bf16 engine.
        """
        from safetensors.torch import save_file

        module = self._module()
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        module.peft_config["default"].save_pretrained(str(path))
        state = {k: v.detach().to(dtype or v.dtype).contiguous() for k, v in self._adapter_state().items()}
        save_file(state, str(path / "adapter_model.safetensors"), metadata={"format": "pt"})

    def adapter_tensors(self) -> dict[str, torch.Tensor]:
        """The adapter's tensors under peft's names (what `save_adapter` writes); the live parameters, not copies."""
        return self._adapter_state()

    def adapter_config(self) -> dict[str, Any]:
        """peft's adapter config as plain data (what `save_adapter` writes as adapter_config.json)."""
        config = self._module().peft_config["default"].to_dict()
        return json.loads(json.dumps(config, default=lambda value: sorted(value) if isinstance(value, set) else str(value)))

    def _adapter_state(self) -> dict[str, torch.Tensor]:
        """peft's adapter state dict. Walking the model for it is most of a save's cost, and its tensors are
        the parameters' own storage (updated in place by the optimizer), so it is computed once."""
        from peft import get_peft_model_state_dict

        if self._adapter_tensors is None:
            module = self._module()
            state = get_peft_model_state_dict(module)
            live = {p.data_ptr() for p in module.parameters()}
            if not all(t.data_ptr() in live for t in state.values()):
                return state  # copies, not views: they must be taken afresh every time
            self._adapter_tensors = state
        return self._adapter_tensors

    def save_pretrained(self, path: Path, dtype: torch.dtype | None = None) -> None:
        """A full merged checkpoint (what a fresh engine would load)."""
        module = self._module()
        module.merge_adapter()
        try:
            base = cast("PreTrainedModel", module.get_base_model())  # the model `load` wrapped
            state = {k.replace(".base_layer", ""): v.to(dtype or v.dtype) for k, v in hf_weights(base) if "lora_" not in k}
            base.save_pretrained(path, state_dict=state, safe_serialization=True)
        finally:
            module.unmerge_adapter()

    def _module(self) -> PeftModel:
        if self.module is None:
            raise RuntimeError("policy used before load()")
        return cast("PeftModel", self.module)  # what `load` put there
