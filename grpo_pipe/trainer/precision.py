"""The trainer's precision (`trainer.precision.dtype`, `trainer.precision.autocast`): master weights in one dtype, forward and
backward under autocast to another."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, Literal

import torch

from grpo_pipe.dtypes import DTYPES

AutocastName = Literal["auto", "bfloat16", "float16"]  # the compute dtype of forward and backward


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """The weights' dtype. `auto` = fp32 master weights on every device: AdamW's update at RL learning rates
    is smaller than a bf16 weight's rounding step (at lr 2e-5 one update changes 4% of SmolLM2's bf16
    weights and leaves the rest as they were), so weights stored in bf16 barely learn."""
    if name == "auto":
        return torch.float32
    return DTYPES[name]


@dataclass(frozen=True)
class Precision:
    """Weights (and optimizer state) in `weights`; forward and backward under autocast to `compute` when set.

    Args:
        weights: The dtype of the weights and the optimizer state.
        compute: The autocast dtype of forward and backward; None: no autocast (compute in `weights`).
    """

    weights: torch.dtype
    compute: torch.dtype | None

    @classmethod
    def resolve(cls, weights: str, autocast: str | None, device: torch.device) -> Precision:
        """`autocast: auto` = bf16 compute on a GPU (as TRL and mixed-precision training generally), none on
        a CPU (bf16 matmuls there are slow and inexact)."""
        weight_dtype = resolve_dtype(weights, device)
        if autocast == "auto":
            autocast = "bfloat16" if device.type == "cuda" else None
        compute = None if autocast is None else DTYPES[autocast]
        return cls(weight_dtype, None if compute == weight_dtype else compute)

    def autocast(self, device: torch.device) -> AbstractContextManager[Any]:
        if self.compute is None:
            return nullcontext()
        return torch.autocast(device.type, dtype=self.compute)
