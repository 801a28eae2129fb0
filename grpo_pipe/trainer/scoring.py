"""The log-probs the loss reads: the policy's and the frozen reference's, of a micro-batch's completion tokens.

Either layout gives [B, T] scores, zero where nothing is scored, beside the batch's `LossInputs`. Padded, the model
projects the completion positions to the vocabulary (`logits_to_keep`) and the log-softmax reads them in row chunks
(trainer/batch.py). Packed, only the M scored positions are projected, in chunks by the head alone when the decoder
and head can be run apart (trainer/lm_head.py), then scattered back to [B, T].
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import torch

from grpo_pipe.trainer.batch import MicroBatch, completion_entropy, completion_logprobs
from grpo_pipe.trainer.lm_head import head_logprobs, logits_logprobs
from grpo_pipe.trainer.packing import PackedBatch
from grpo_pipe.trainer.precision import Precision


@dataclass(frozen=True, kw_only=True)
class Scorer:
    """Runs the trainer's model (and its frozen reference) on a micro-batch and reads the completions' scores.

    Args:
        module: The policy's causal LM.
        reference_logits: The frozen starting policy's logits for the same forward arguments, without gradients.
        device: Where the model runs.
        dtypes: The weights' dtype and the autocast the forward runs under.
        logits_to_keep: The model takes Hugging Face's `logits_to_keep` (`takes_logits_to_keep`).
        parts: The model's decoder and lm head, run apart on packed micro-batches (the head on the scored positions
            only); None: the whole model runs (padded, or a sharded root whose hooks gather the head's weights).
        fused_head: The head's log-softmax is compiled into one function (with compiled layers; lm_head.py).
    """

    module: torch.nn.Module
    reference_logits: Callable[[Mapping[str, Any]], torch.Tensor]
    device: torch.device
    dtypes: Precision
    logits_to_keep: bool
    parts: tuple[torch.nn.Module, torch.nn.Module] | None = None
    fused_head: bool = False

    def policy_scores(self, batch: MicroBatch | PackedBatch, temperature: float, entropy_grad: bool,
                      need_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The policy's log-probs of the completion tokens and its entropy at them, [B, T] each, zero where nothing
        is scored. Packed, the entropy comes with the log-probs from the same chunk of logits; padded, only when
        `need_entropy`.

        Args:
            batch: The micro-batch, padded or packed.
            temperature: The sampling temperature the logits are divided by.
            entropy_grad: The entropy keeps its gradient (the entropy bonus is a term of the loss).
            need_entropy: The entropy is wanted (padded micro-batches skip it otherwise).
        """
        if isinstance(batch, PackedBatch):
            with self.dtypes.autocast(self.device):
                if self.parts is not None:
                    decoder, head = self.parts
                    hidden = decoder(**batch.model_inputs()).last_hidden_state  # [1, N, H]
                    scored = hidden[0].index_select(0, batch.predicting)  # [M, H]
                    logprobs, entropy = head_logprobs(scored, head, batch.targets, temperature, entropy_grad,
                                                      fused=self.fused_head)
                else:  # the whole model, its head on the scored positions only
                    inputs = {**batch.model_inputs(), "logits_to_keep": batch.predicting}
                    logits = self.module(**inputs).logits[0]  # [M, V]
                    logprobs, entropy = logits_logprobs(logits, batch.targets, temperature, entropy_grad,
                                                        fused=self.fused_head)  # [M]
            return batch.scatter(logprobs), batch.scatter(entropy)
        with self.dtypes.autocast(self.device):
            logits = self.module(**batch.model_inputs(self.logits_to_keep)).logits  # [B, T + 1 or P + T, V]
        new_logprobs = completion_logprobs(logits, batch, temperature)  # [B, T]
        if not need_entropy:
            return new_logprobs, None
        return new_logprobs, completion_entropy(logits, batch, temperature, grad=entropy_grad)

    def reference_logprobs(self, batch: MicroBatch | PackedBatch, temperature: float) -> torch.Tensor:
        """The frozen reference's log-probs of the completion tokens, [B, T], zero where nothing is scored.

        Args:
            batch: The micro-batch, padded or packed.
            temperature: The sampling temperature the logits are divided by.
        """
        with torch.no_grad(), self.dtypes.autocast(self.device):
            if isinstance(batch, PackedBatch):  # the frozen model's head on the scored positions only
                inputs = {**batch.model_inputs(), "logits_to_keep": batch.predicting}
                logits = self.reference_logits(inputs)[0]  # [M, V]
                return batch.scatter(logits_logprobs(logits, batch.targets, temperature, fused=self.fused_head)[0])
            logits = self.reference_logits(batch.model_inputs(self.logits_to_keep))
            return completion_logprobs(logits, batch, temperature)  # [B, T]


def takes_logits_to_keep(module: torch.nn.Module | None) -> bool:
    """Whether the causal LM's forward takes Hugging Face's `logits_to_keep` (most do; custom code may not).
    With it the vocabulary projection and its activations cover the completions only, not the prompts.

    Args:
        module: The causal LM, or a peft wrapper around it.
    """
    if module is None:
        return False
    unwrap = getattr(module, "get_base_model", None)  # through a peft wrapper to the causal LM
    base = cast(torch.nn.Module, unwrap()) if callable(unwrap) else module
    return "logits_to_keep" in inspect.signature(base.forward).parameters


def is_sharded(module: torch.nn.Module) -> bool:
    """Whether `module` is sharded by FSDP (its forward must be entered at the root, whose hooks gather weights).

    Args:
        module: The policy's model.
    """
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)
