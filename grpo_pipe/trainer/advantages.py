"""Advantages and normalisers: what every objective of the GRPO family shares, whatever its per-token term.

How this departs from the GRPO paper (Shao et al., 2024):
1. The group std is the *sample* std (N - 1), as `torch.std`, TRL and the GRPO reference code, so advantages compare
   with theirs. A group whose rewards are all equal gets advantage exactly 0 in any dtype: it is detected, never left
   to float cancellation. Dr.GRPO (Liu et al., 2025) leaves the std out (`normalize_std=False`).
2. Aggregation is a choice: `sequence_mean` (GRPO: each completion's tokens averaged over its own length, then over
   completions), `constant` (Dr.GRPO: summed tokens / (completions x a constant budget)), `token_mean` (DAPO: summed
   tokens / all tokens of the batch) or `micro_batch_token_mean` (TRL's `loss_type="bnpo"`: each micro-batch's tokens
   averaged, then over the step's micro-batches; its scale then moves with `trainer.batching.micro_batch_size`).
3. Losses are pre-divided by the *whole* batch's normaliser, so micro-batch losses summed by gradient accumulation
   give exactly the full-batch gradient.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch

Aggregation = Literal["sequence_mean", "constant", "token_mean", "micro_batch_token_mean"]
AGGREGATIONS: tuple[Aggregation, ...] = ("sequence_mean", "constant", "token_mean", "micro_batch_token_mean")


def group_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, normalize_std: bool) -> torch.Tensor:
    """Reward minus its group's mean, optionally divided by the group's sample std.

    Args:
        rewards: [N] float, one per completion.
        group_ids: [N] long; equal ids share a prompt.
        normalize_std: Divide by the group's sample std (GRPO); False: centred only (Dr.GRPO).

    Returns [N]. A group whose rewards are all equal gets exactly zero advantage (it carries no signal).
    """
    n_groups = int(group_ids.max().item()) + 1
    dtype = rewards.dtype
    counts = torch.zeros(n_groups, dtype=dtype).index_add_(0, group_ids, torch.ones_like(rewards))  # [G]
    means = torch.zeros(n_groups, dtype=dtype).index_add_(0, group_ids, rewards) / counts  # [G]
    highest = torch.full((n_groups,), -torch.inf, dtype=dtype).scatter_reduce(0, group_ids, rewards, "amax")  # [G]
    lowest = torch.full((n_groups,), torch.inf, dtype=dtype).scatter_reduce(0, group_ids, rewards, "amin")  # [G]
    flat = (highest == lowest)[group_ids]  # [N] no spread: the mean may round away from the value itself
    centred = torch.where(flat, torch.zeros_like(rewards), rewards - means[group_ids])  # [N]
    if not normalize_std:
        return centred
    sq = torch.zeros(n_groups, dtype=dtype).index_add_(0, group_ids, centred**2)  # [G]
    std = torch.sqrt(sq / (counts - 1).clamp(min=1))  # [G] sample std (N - 1), as torch.std
    return centred / (std[group_ids] + 1e-4)


def batch_normaliser(aggregation: Aggregation, lengths: Sequence[int], micro_batches: int, max_tokens: int | None) -> float:
    """What the whole batch's summed loss is divided by.

    Args:
        aggregation: How token losses are averaged (see the module docstring).
        lengths: Lengths of every completion that gets a loss (skipped zero-advantage ones included: they add zero,
            not nothing).
        micro_batches: How many the step's are (bnpo averages over them, each over its own tokens).
        max_tokens: The constant per-completion budget of `constant` (Dr.GRPO).
    """
    if aggregation == "micro_batch_token_mean":
        return float(max(micro_batches, 1))
    if aggregation == "sequence_mean":
        return float(max(len(lengths), 1))
    if aggregation == "constant":
        assert max_tokens is not None
        return float(max(len(lengths), 1) * max_tokens)
    return float(max(sum(lengths), 1))  # token_mean


def aggregate(summed: torch.Tensor, mask: torch.Tensor, aggregation: Aggregation, normaliser: float) -> torch.Tensor:
    """One micro-batch's scalar loss from its masked per-token losses `summed` [B, T] and `mask` [B, T]."""
    if aggregation == "sequence_mean":
        return (summed.sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)).sum() / normaliser
    if aggregation == "micro_batch_token_mean":  # bnpo: this micro-batch's tokens, then over micro-batches
        return summed.sum() / mask.sum().clamp(min=1.0) / normaliser
    return summed.sum() / normaliser  # constant and token_mean differ only in the normaliser
