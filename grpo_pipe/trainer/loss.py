"""GRPO and Dr.GRPO policy-gradient losses as pure functions.

How this departs from the GRPO paper (Shao et al., 2024):
1. The importance ratio is taken against the *sampling* log-probabilities reported by the inference
   engine, not against a recomputed "old policy" forward pass: this corrects for both off-policy
   lag (async, sync every k steps) and engine/trainer numeric mismatch, and saves one forward pass.
2. The KL penalty to a reference model is optional and off by default (as in DAPO / Dr.GRPO).
3. `dr_grpo` aggregation (Liu et al., 2025) divides by a constant (sequences x max tokens) instead of
   each sequence's own length, removing the length bias; it is usually paired with
   `normalize_std=False`.
4. Losses are returned pre-scaled by the *whole* batch's normaliser so that micro-batch losses can
   simply be summed by gradient accumulation and give exactly the full-batch gradient.
5. With `is_cap` set, stale samples (async rollouts) are corrected by truncated importance sampling
   instead: the clipped surrogate is taken against the trainer's own current weights (the proximal
   policy, as in decoupled PPO: with one update per batch its ratio is 1 with the gradient of
   log pi), and each token is weighted by min(pi_trainer / pi_sampler, is_cap), detached. Clipping
   against the sampler would zero the gradient of every token the policy has since moved away from;
   truncation keeps the gradient and bounds the variance.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

Aggregation = Literal["grpo", "dr_grpo"]


def group_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, normalize_std: bool) -> torch.Tensor:
    """Reward minus its group's mean, optionally divided by the group's std.

    rewards: [N] float; group_ids: [N] long, equal ids share a prompt. Returns [N].
    A group whose rewards are all equal gets zero advantage (it carries no signal).
    """
    n_groups = int(group_ids.max().item()) + 1
    counts = torch.zeros(n_groups, dtype=rewards.dtype).index_add_(0, group_ids, torch.ones_like(rewards))  # [G]
    means = torch.zeros(n_groups, dtype=rewards.dtype).index_add_(0, group_ids, rewards) / counts  # [G]
    centred = rewards - means[group_ids]  # [N]
    if not normalize_std:
        return centred
    sq = torch.zeros(n_groups, dtype=rewards.dtype).index_add_(0, group_ids, centred**2)  # [G]
    std = torch.sqrt(sq / (counts - 1).clamp(min=1))  # [G] unbiased, as torch.std
    return centred / (std[group_ids] + 1e-4)


@dataclass(frozen=True)
class LossStats:
    """Detached statistics of one loss call (summed contributions; divide by batch where noted)."""

    clipped_tokens: float
    tokens: float
    kl_sum: float
    ratio_max: float


def policy_loss(
    new_logprobs: torch.Tensor,  # [B, T] log pi_theta(token) for completion tokens
    old_logprobs: torch.Tensor,  # [B, T] log-prob under the policy that sampled the token
    advantages: torch.Tensor,  # [B]
    mask: torch.Tensor,  # [B, T] 1 for completion tokens, 0 for padding
    *,
    aggregation: Aggregation,
    clip_low: float,
    clip_high: float,
    total_sequences: int,  # sequences in the whole optimizer step (all micro-batches)
    max_tokens: int,  # dr_grpo's constant per-sequence normaliser
    ref_logprobs: torch.Tensor | None = None,  # [B, T] when a KL penalty is used
    kl_coef: float = 0.0,
    is_cap: float | None = None,  # truncated importance sampling against the sampler (see 5. above)
) -> tuple[torch.Tensor, LossStats]:
    """Clipped-surrogate loss for one micro-batch, scaled for summing over micro-batches."""
    mask = mask.to(new_logprobs.dtype)
    if is_cap is None:
        ratio = torch.exp(new_logprobs - old_logprobs)  # [B, T] against the sampler
        weight = torch.ones_like(ratio)  # [B, T]
    else:
        ratio = torch.exp(new_logprobs - new_logprobs.detach())  # [B, T] against the proximal policy: 1
        weight = torch.exp(new_logprobs.detach() - old_logprobs).clamp(max=is_cap)  # [B, T] truncated IS
    adv = advantages.unsqueeze(1)  # [B, 1]
    unclipped = ratio * adv  # [B, T]
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv  # [B, T]
    per_token = -weight * torch.minimum(unclipped, clipped)  # [B, T] pessimistic bound, as PPO
    kl = torch.zeros_like(per_token)
    if ref_logprobs is not None and kl_coef > 0:
        log_ratio_ref = ref_logprobs - new_logprobs  # [B, T]
        kl = torch.exp(log_ratio_ref) - log_ratio_ref - 1.0  # [B, T] k3 estimator, >= 0
        per_token = per_token + kl_coef * kl
    if aggregation == "grpo":
        lengths = mask.sum(dim=1).clamp(min=1.0)  # [B]
        loss = ((per_token * mask).sum(dim=1) / lengths).sum() / total_sequences
    elif aggregation == "dr_grpo":
        loss = (per_token * mask).sum() / (total_sequences * max_tokens)
    else:  # validated at config time; kept so a bad call cannot silently pick one
        raise ValueError(f"aggregation={aggregation!r}; allowed: 'grpo', 'dr_grpo'")
    with torch.no_grad():
        was_clipped = ((unclipped - clipped).abs() > 0) & (mask > 0)
        stats = LossStats(
            clipped_tokens=float(was_clipped.sum()),
            tokens=float(mask.sum()),
            kl_sum=float((kl * mask).sum()),
            ratio_max=float((torch.exp(new_logprobs.detach() - old_logprobs) * mask).max()) if mask.any() else 1.0,
        )
    return loss, stats
