"""Turn rollout groups into padded training tensors."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from grpo_pipe.types import RolloutGroup


@dataclass(frozen=True)
class TrainSample:
    """One completion ready for the loss: prompt + completion ids and what the engine reported."""

    prompt_ids: tuple[int, ...]  # [P]
    completion_ids: tuple[int, ...]  # [T]
    sampling_logprobs: tuple[float, ...]  # [T]
    advantage: float
    policy_version: int
    truncated: bool = False  # hit the generation budget without EOS (finish_reason "length")


def flatten(groups: Sequence[RolloutGroup], advantages: Sequence[float]) -> list[TrainSample]:
    """One TrainSample per completion, in group order then completion order (matching rewards)."""
    samples: list[TrainSample] = []
    index = 0
    for group in groups:
        for completion in group.completions:
            samples.append(
                TrainSample(
                    prompt_ids=group.prompt_token_ids,
                    completion_ids=completion.token_ids,
                    sampling_logprobs=completion.logprobs,
                    advantage=float(advantages[index]),
                    policy_version=completion.policy_version,
                    truncated=completion.finish_reason == "length",
                )
            )
            index += 1
    return samples


@dataclass(frozen=True)
class MicroBatch:
    input_ids: torch.Tensor  # [B, L] prompt + completion, right-padded
    attention_mask: torch.Tensor  # [B, L]
    completion_mask: torch.Tensor  # [B, T] 1 on completion tokens
    completion_start: torch.Tensor  # [B] index of the first completion token in input_ids
    sampling_logprobs: torch.Tensor  # [B, T]
    advantages: torch.Tensor  # [B]


def collate(samples: Sequence[TrainSample], pad_id: int, device: torch.device) -> MicroBatch:
    lengths = [len(s.prompt_ids) + len(s.completion_ids) for s in samples]
    max_len = max(lengths)
    max_completion = max(max(len(s.completion_ids) for s in samples), 1)
    batch = len(samples)
    input_ids = torch.full((batch, max_len), pad_id, dtype=torch.long)
    attention = torch.zeros((batch, max_len), dtype=torch.long)
    completion_mask = torch.zeros((batch, max_completion), dtype=torch.float32)
    logprobs = torch.zeros((batch, max_completion), dtype=torch.float32)
    for row, sample in enumerate(samples):
        ids = sample.prompt_ids + sample.completion_ids
        input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention[row, : len(ids)] = 1
        n = len(sample.completion_ids)
        completion_mask[row, :n] = 1.0
        logprobs[row, :n] = torch.tensor(sample.sampling_logprobs, dtype=torch.float32)
    return MicroBatch(
        input_ids=input_ids.to(device),
        attention_mask=attention.to(device),
        completion_mask=completion_mask.to(device),
        completion_start=torch.tensor([len(s.prompt_ids) for s in samples], device=device),
        sampling_logprobs=logprobs.to(device),
        advantages=torch.tensor([s.advantage for s in samples], dtype=torch.float32, device=device),
    )


def completion_logprobs(logits: torch.Tensor, batch: MicroBatch, temperature: float) -> torch.Tensor:
    """log pi(token) for each completion token. logits: [B, L, V] -> [B, T].

    Position p's logits predict token p+1, so completion token j (at input index start+j) is read
    from logits at start+j-1. Only those rows are log-softmaxed, which keeps memory at [B, T, V].
    """
    _, width = batch.completion_mask.shape
    offsets = torch.arange(width, device=logits.device)  # [T]
    positions = (batch.completion_start.unsqueeze(1) - 1 + offsets).clamp(max=logits.shape[1] - 1)  # [B, T]
    picked = logits.gather(1, positions.unsqueeze(-1).expand(-1, -1, logits.shape[-1]))  # [B, T, V]
    targets_pos = (positions + 1).clamp(max=batch.input_ids.shape[1] - 1)  # [B, T]
    targets = batch.input_ids.gather(1, targets_pos)  # [B, T]
    logp = torch.log_softmax(picked.float() / temperature, dim=-1)  # [B, T, V]
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1) * batch.completion_mask  # [B, T]
