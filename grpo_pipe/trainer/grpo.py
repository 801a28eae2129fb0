"""The GRPO optimisation step: advantages, micro-batched clipped-surrogate loss, one AdamW update.

Completions whose advantage is exactly zero (groups where every sample got the same reward) add
nothing to the policy gradient, so with the KL term off they are counted in the normaliser but
never run through the model: on CPU this often halves the step time.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

import torch

from grpo_pipe.dtypes import DTYPES, DtypeName
from grpo_pipe.trainer.batch import TrainSample, collate, completion_logprobs, flatten
from grpo_pipe.trainer.loss import Aggregation, group_advantages, policy_loss
from grpo_pipe.types import RolloutGroup

log = logging.getLogger(__name__)


class TrainablePolicy(Protocol):
    module: torch.nn.Module | None

    def load(self, model_path: Path, device: torch.device, dtype: torch.dtype) -> None: ...

    def trainable_parameters(self) -> list[torch.nn.Parameter]: ...


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """`auto` = bf16 on GPU, fp32 on CPU (bf16 matmuls on CPU are slow and inexact)."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[name]


class GRPOTrainer:
    """Owns the policy, its optimizer and LR schedule; one `step` = one optimizer update."""

    def __init__(
        self,
        policy: TrainablePolicy,
        steps: int = 40,
        lr: float = 1e-5,
        weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.99),
        lr_schedule: Literal["constant", "constant_with_warmup", "linear", "cosine"] = "constant_with_warmup",
        warmup_steps: int = 0,
        grad_clip: float = 1.0,
        micro_batch_size: int = 8,
        aggregation: Aggregation = "grpo",
        normalize_std: bool = True,
        clip_low: float = 0.2,
        clip_high: float = 0.28,
        kl_coef: float = 0.0,
        dtype: DtypeName = "auto",
        max_bad_steps: int = 3,
        is_cap: float | None = None,
        skip_zero_advantage: bool = True,
    ) -> None:
        if steps < 1:
            raise ValueError(f"trainer.steps={steps}: must be >= 1")
        if micro_batch_size < 1:
            raise ValueError(f"trainer.micro_batch_size={micro_batch_size}: must be >= 1")
        if is_cap is not None and is_cap <= 0:
            raise ValueError(f"trainer.is_cap={is_cap}: must be > 0, or null for ratio clipping against the sampler")
        if kl_coef > 0:
            raise ValueError("trainer.kl_coef > 0 needs a reference model, which is not wired in yet; use 0.0")
        self.policy = policy
        self.steps = steps
        self.lr = lr
        self.weight_decay = weight_decay
        self.betas = tuple(betas)
        self.lr_schedule = lr_schedule
        self.warmup_steps = warmup_steps
        self.grad_clip = grad_clip
        self.micro_batch_size = micro_batch_size
        self.aggregation = aggregation
        self.normalize_std = normalize_std
        self.clip_low = clip_low
        self.clip_high = clip_high
        self.kl_coef = kl_coef
        self.dtype_name = dtype
        self.max_bad_steps = max_bad_steps
        self.is_cap = is_cap
        self.skip_zero_advantage = skip_zero_advantage
        self.version = 0  # bumped by every applied optimizer update
        self.bad_steps_in_a_row = 0
        self.skipped_updates = 0  # non-finite updates skipped over the whole run
        self.device = torch.device("cpu")
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: Any = None
        self.pad_id = 0

    def setup(self, model_path: Path, device: torch.device, pad_id: int) -> None:
        from transformers import get_scheduler

        self.device = device
        self.pad_id = pad_id
        self.policy.load(model_path, device, resolve_dtype(self.dtype_name, device))
        self.optimizer = torch.optim.AdamW(
            self.policy.trainable_parameters(), lr=self.lr, betas=self.betas, weight_decay=self.weight_decay
        )
        self.scheduler = get_scheduler(
            self.lr_schedule, self.optimizer, num_warmup_steps=self.warmup_steps, num_training_steps=self.steps
        )

    def state_dict(self) -> dict[str, Any]:
        """Everything an exact resume needs: trainable weights, optimizer, LR schedule, counters, RNG."""
        if self.optimizer is None or self.policy.module is None:
            raise RuntimeError("trainer used before setup()")
        params = {n: p.detach().cpu().clone() for n, p in self.policy.module.named_parameters() if p.requires_grad}
        return {
            "params": params,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "version": self.version,
            "bad_steps_in_a_row": self.bad_steps_in_a_row,
            "skipped_updates": self.skipped_updates,
            "torch_rng": torch.get_rng_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.optimizer is None or self.policy.module is None:
            raise RuntimeError("trainer used before setup()")
        named = dict(self.policy.module.named_parameters())
        missing = sorted(set(state["params"]) - set(named))
        if missing:
            raise ValueError(f"checkpoint has parameters this policy lacks (another policy config?): {missing[:5]}")
        with torch.no_grad():
            for name, tensor in state["params"].items():
                named[name].copy_(tensor.to(named[name].device, named[name].dtype))
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.version = int(state["version"])
        self.bad_steps_in_a_row = int(state["bad_steps_in_a_row"])
        self.skipped_updates = int(state["skipped_updates"])
        torch.set_rng_state(state["torch_rng"])

    def step(self, groups: Sequence[RolloutGroup], rewards: Sequence[float], temperature: float) -> dict[str, float]:
        """One optimizer update on these groups. Returns `train/...` metrics."""
        started = time.perf_counter()
        metrics = self.accumulate_gradients(groups, rewards, temperature)
        applied, grad_norm = self._apply_update()
        return {
            **metrics,
            "train/grad_norm": grad_norm,
            "train/update_applied": float(applied),
            "train/skipped_updates_total": float(self.skipped_updates),
            "train/lr": self.scheduler.get_last_lr()[0],
            "train/step_s": time.perf_counter() - started,
        }

    def accumulate_gradients(
        self, groups: Sequence[RolloutGroup], rewards: Sequence[float], temperature: float
    ) -> dict[str, float]:
        """Fill `.grad` with the full batch's loss gradient, micro-batch by micro-batch."""
        if self.optimizer is None:
            raise RuntimeError("trainer used before setup()")
        reward_t = torch.tensor(rewards, dtype=torch.float32)  # [N]
        group_ids = torch.repeat_interleave(
            torch.arange(len(groups)), torch.tensor([len(g.completions) for g in groups])
        )  # [N]
        advantages = group_advantages(reward_t, group_ids, self.normalize_std)  # [N]
        samples = flatten(groups, advantages.tolist())
        active = [s for s in samples if s.advantage != 0.0 or self.kl_coef > 0 or not self.skip_zero_advantage]
        max_tokens = max((len(s.completion_ids) for s in samples), default=1)
        stats = self._accumulate(active, total=len(samples), max_tokens=max_tokens, temperature=temperature)
        return {
            **stats,
            "train/active_samples": float(len(active)),
            "train/samples": float(len(samples)),
            "train/advantage_abs_mean": float(advantages.abs().mean()),
        }

    def _accumulate(
        self, active: list[TrainSample], total: int, max_tokens: int, temperature: float
    ) -> dict[str, float]:
        module = self.policy.module
        assert module is not None and self.optimizer is not None
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum, clipped, tokens, ratio_max = 0.0, 0.0, 0.0, 0.0
        # Similar lengths share a micro-batch, so padding stays small.
        ordered = sorted(active, key=lambda s: len(s.prompt_ids) + len(s.completion_ids))
        for start in range(0, len(ordered), self.micro_batch_size):
            batch = collate(ordered[start : start + self.micro_batch_size], self.pad_id, self.device)
            logits = module(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits  # [B, L, V]
            new_logprobs = completion_logprobs(logits, batch, temperature)  # [B, T]
            loss, stats = policy_loss(
                new_logprobs,
                batch.sampling_logprobs,
                batch.advantages,
                batch.completion_mask,
                aggregation=self.aggregation,
                clip_low=self.clip_low,
                clip_high=self.clip_high,
                total_sequences=total,
                max_tokens=max_tokens,
                is_cap=self.is_cap,
            )
            loss.backward()
            loss_sum += float(loss.detach())
            clipped += stats.clipped_tokens
            tokens += stats.tokens
            ratio_max = max(ratio_max, stats.ratio_max)
        return {
            "train/loss": loss_sum,
            "train/clip_fraction": clipped / tokens if tokens else 0.0,
            "train/ratio_max": ratio_max,
            "train/tokens": tokens,
        }

    def _apply_update(self) -> tuple[bool, float]:
        """Clip and apply; a non-finite gradient skips the update instead of poisoning the weights."""
        assert self.optimizer is not None
        params = self.policy.trainable_parameters()
        has_grad = any(p.grad is not None for p in params)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, self.grad_clip)) if has_grad else 0.0
        if not math.isfinite(grad_norm):
            self.bad_steps_in_a_row += 1
            self.skipped_updates += 1
            log.warning("Non-finite gradient (norm=%s); update skipped (%d in a row)", grad_norm, self.bad_steps_in_a_row)
            if self.bad_steps_in_a_row >= self.max_bad_steps:
                raise FloatingPointError(f"{self.bad_steps_in_a_row} non-finite updates in a row (trainer.max_bad_steps)")
            self.optimizer.zero_grad(set_to_none=True)
            self.optimizer.step()  # no gradients: changes nothing, keeps the scheduler's step order
            self.scheduler.step()
            return False, grad_norm
        self.bad_steps_in_a_row = 0
        self.optimizer.step()  # a no-op for parameters without gradients
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        self.version += 1
        return True, grad_norm
