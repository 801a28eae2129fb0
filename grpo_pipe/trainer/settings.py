"""The GRPO trainer's settings, one small group per concern (`trainer.optimisation`, `trainer.batching`,
`trainer.precision`), each frozen as the config said it and with its rules beside its fields (`config_problems`)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch

from grpo_pipe.config.errors import failed
from grpo_pipe.dtypes import DtypeName
from grpo_pipe.interfaces import ChecksItsConfig
from grpo_pipe.trainer.precision import AutocastName
from grpo_pipe.trainer.schedule import WarmupSchedule

# What the trainer completes: the optimizer (a `_partial_` component) gets the trainable parameters and the lr;
# the LR schedule (`WarmupSchedule`) is called with the optimizer and the number of updates in the run.
OptimizerFactory = Callable[..., torch.optim.Optimizer]
ScheduleFactory = Callable[[torch.optim.Optimizer, int], Any]


@dataclass(frozen=True, kw_only=True)
class OptimisationSettings:
    """How one batch moves the weights: the optimizer and its LR schedule, clipping, GRPO's mu, and how many
    non-finite updates in a row end the run.

    Args:
        optimizer: A `_partial_` optimizer (`optimizer=`) the trainer calls with its trainable parameters and `lr`;
            None: AdamW without weight decay.
        lr_schedule: The LR schedule (`WarmupSchedule`); None: a constant LR.
        lr: Handed to the optimizer; the schedule scales it.
        grad_clip: The gradients' total norm is clipped to this.
        updates_per_batch: GRPO's mu: optimizer passes over one batch (ratio against the sampler, clipped).
        max_bad_steps: Non-finite updates in a row before the run stops.
        diagnose_non_finite: A non-finite gradient: its pass again under autograd's anomaly mode, naming the backward
            op and forward line that made the NaN (single-device trainer only).
    """

    optimizer: OptimizerFactory | None = None  # None: AdamW without weight decay
    lr_schedule: ScheduleFactory | None = None  # None: a constant LR
    lr: float = 1e-5  # handed to the optimizer; the schedule scales it
    grad_clip: float = 1.0
    updates_per_batch: int = 1  # GRPO's mu: optimizer passes over one batch
    max_bad_steps: int = 3  # non-finite updates in a row before the run stops
    diagnose_non_finite: bool = True  # a bad step runs its pass again under anomaly mode, to name the op (one-device trainer)

    def config_problems(self) -> list[str]:
        """These settings' rules, and those of the schedule they were given."""
        own = failed(
            (self.lr > 0, f"trainer.optimisation.lr={self.lr}: must be > 0"),
            (self.grad_clip > 0, f"trainer.optimisation.grad_clip={self.grad_clip}: must be > 0"),
            (self.updates_per_batch >= 1,
             f"trainer.optimisation.updates_per_batch={self.updates_per_batch}: must be >= 1 (GRPO's mu)"),
            (self.max_bad_steps >= 1, f"trainer.optimisation.max_bad_steps={self.max_bad_steps}: must be >= 1"),
        )
        schedule = self.lr_schedule
        return own + (schedule.config_problems() if isinstance(schedule, ChecksItsConfig) else [])

    def make_optimizer(self, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
        factory = self.optimizer or functools.partial(torch.optim.AdamW, betas=(0.9, 0.999), weight_decay=0.0)
        return factory(params, lr=self.lr)

    def make_scheduler(self, optimizer: torch.optim.Optimizer, steps: int) -> Any:
        """The LR scheduler over the run's updates: `steps` batches of `updates_per_batch` updates each."""
        schedule = self.lr_schedule or WarmupSchedule(name="constant")
        return schedule(optimizer, steps * self.updates_per_batch)


@dataclass(frozen=True, kw_only=True)
class BatchingSettings:
    """How a batch is cut into forward/backward passes; gradients accumulate to the whole batch either way.

    Packed (the default): the length-sorted completions are laid end to end, each with its prompt, in micro-batches of
    at most `max_tokens` tokens, no padding. Padded (`packed: false`): `micro_batch_size` rows each, padded to the
    widest; kept for models whose attention cannot take packed rows (sliding windows) and to compare.

    Args:
        packed: Sequences end to end, no padding, each attending to itself only; False = padded rows of
            `micro_batch_size` (models with sliding-window attention fall back to these).
        max_tokens: Packed: prompt + completion tokens per forward/backward. None: on one GPU, the largest power of
            two that fits the card's free memory, measured in set-up (trainer/token_budget.py); 16384 on each rank of
            a sharded trainer; 4096 on a CPU.
        micro_batch_size: Padded: sequences per forward/backward; None = 16 on a GPU, 8 on a CPU.
        skip_zero_advantage: Completions with zero advantage add no gradient: skip their forward/backward (False:
            benchmarks at full cost).
    """

    packed: bool = True  # sequences end to end in token-budgeted micro-batches (trainer/packing.py); False: padded rows
    max_tokens: int | None = None  # packed: tokens per forward/backward; None: the device's default
    micro_batch_size: int | None = None  # padded: sequences per forward/backward; None: the device's default
    skip_zero_advantage: bool = True  # completions with zero advantage add no gradient: their passes are skipped

    def config_problems(self) -> list[str]:
        size, budget = self.micro_batch_size, self.max_tokens
        return failed(
            (size is None or size >= 1,
             f"trainer.batching.micro_batch_size={size}: must be >= 1, or null for the device's default"),
            (budget is None or budget >= 64,
             f"trainer.batching.max_tokens={budget}: must be >= 64, or null for the device's default"),
        )


@dataclass(frozen=True, kw_only=True)
class PrecisionSettings:
    """The numbers the policy is trained in: the weights' dtype, the forward/backward's autocast dtype, and whether
    the decoder layers are compiled.

    Args:
        dtype: The weights' and optimizer's dtype; `auto` = float32 master weights (bfloat16 weights barely learn at
            RL learning rates: the updates round away).
        autocast: The forward/backward compute dtype; `auto` = bfloat16 on a GPU, none on a CPU; None = the weights'.
        compile: `torch.compile` each decoder layer, in set-up; `auto` = on a GPU, off on a CPU.
    """

    dtype: DtypeName = "auto"  # weights and optimizer state; auto: float32 master weights
    autocast: AutocastName | None = "auto"  # auto: bfloat16 on a GPU, none on a CPU; None: the weights' dtype
    compile: bool | Literal["auto"] = "auto"  # auto: on a GPU, off on a CPU

    def config_problems(self) -> list[str]:
        return failed(
            (self.compile in (True, False, "auto"),
             f"trainer.precision.compile={self.compile}: must be auto, true or false"),
        )
