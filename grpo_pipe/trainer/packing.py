"""Packed micro-batches (`trainer.batching.max_tokens`): sequences laid end to end in one row, no padding.

Each sequence (its prompt, then its completion) keeps its own positions, counted from 0 as the engine counted them,
and attends only to itself: the attention (trainer/packed_attention.py) reads the sequences' bounds from
`cu_seq_lens`, as FlashAttention's variable-length kernels do. The loss still sees [B, T] tensors, one row per
completion, the same `LossInputs` as padded micro-batches carry: only the model's input changes, so the loss family, the mismatch
metrics and the optimizer are the same code on either layout.

Why: a padded micro-batch of RL sequences (prompts 60-250 tokens, completions 20-512) spends much of its compute on
padding, and a micro-batch cut by a sequence count holds few tokens when they are short and too many when they are
long. A token budget gives every forward/backward the same amount of work, the size the card runs well.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from grpo_pipe.trainer.batch import LossInputs, TrainSample


@dataclass(frozen=True, kw_only=True)
class PackedBatch:
    """One packed micro-batch: B sequences of lengths L_i in one row of N = sum L_i tokens.

    Args:
        input_ids: [1, N] every sequence's prompt then completion, end to end.
        position_ids: [1, N] restarting at 0 with each sequence.
        cu_seq_lens: [B + 1] int32 where each sequence starts in the row, then N.
        max_length: At least the longest L_i: a power of two, so a compiled layer sees few distinct values.
        predicting: [M] the row positions whose outputs predict the scored tokens (M = completion_mask.sum())
        targets: [M] the scored tokens, the ones the engine sampled.
        loss_inputs: The completions' mask, sampling log-probs and advantages, [B, T] and [B], as padded.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    cu_seq_lens: torch.Tensor
    max_length: int
    predicting: torch.Tensor
    targets: torch.Tensor
    loss_inputs: LossInputs

    def model_inputs(self) -> dict[str, Any]:
        """Keyword arguments of the decoder's forward: no attention mask (the bounds say who sees whom), no cache.

        `cu_seq_lens_q/k` and `max_length_q/k` are the names Hugging Face models pass through to their attention
        function (its FlashAttention keyword arguments)."""
        return dict(input_ids=self.input_ids, position_ids=self.position_ids, use_cache=False,
                    cu_seq_lens_q=self.cu_seq_lens, cu_seq_lens_k=self.cu_seq_lens,
                    max_length_q=self.max_length, max_length_k=self.max_length)

    def scatter(self, values: torch.Tensor) -> torch.Tensor:
        """[M] values of the scored tokens -> [B, T], zero where nothing is scored (differentiable)."""
        mask = self.loss_inputs.completion_mask  # [B, T]
        out = torch.zeros(mask.shape, dtype=values.dtype, device=values.device)  # [B, T]
        return out.masked_scatter(mask.bool(), values)


def sequence_tokens(sample: TrainSample) -> int:
    """Tokens a sample puts in a packed row: its prompt and its completion."""
    return len(sample.prompt_ids) + len(sample.completion_ids)


def token_budget_cuts(samples: Sequence[TrainSample], max_tokens: int) -> list[range]:
    """Consecutive runs of `samples` of at most `max_tokens` tokens each (a longer sequence is a micro-batch alone).
    The samples come sorted by length, so each micro-batch holds sequences of similar length."""
    cuts: list[range] = []
    start, used = 0, 0
    for index, sample in enumerate(samples):
        size = sequence_tokens(sample)
        if index > start and used + size > max_tokens:
            cuts.append(range(start, index))
            start, used = index, 0
        used += size
    if start < len(samples):
        cuts.append(range(start, len(samples)))
    return cuts


def pack(samples: Sequence[TrainSample], device: torch.device, width_multiple: int = 1) -> PackedBatch:
    """Lay `samples` end to end. `width_multiple`: the row is filled up to a multiple of it with one more sequence
    of repeated padding tokens that nothing scores (compiled layers ask for 8, as for padded micro-batches)."""
    ids: list[int] = []
    positions: list[int] = []
    starts: list[int] = [0]
    predicting: list[torch.Tensor] = []
    targets: list[torch.Tensor] = []
    width = max(max(len(s.completion_ids) for s in samples), 1)  # T of the loss's [B, T] inputs
    for sample in samples:
        begin, prompt, count = len(ids), len(sample.prompt_ids), len(sample.completion_ids)
        ids += [*sample.prompt_ids, *sample.completion_ids]
        positions += range(len(ids) - begin)
        starts.append(len(ids))
        mask = torch.ones(count, dtype=torch.bool) if sample.loss_mask is None else torch.tensor(sample.loss_mask,
                                                                                                  dtype=torch.bool)
        # the output at the token before completion token t predicts it
        predicting.append((torch.arange(count) + (begin + prompt - 1))[mask])
        targets.append(torch.tensor(sample.completion_ids, dtype=torch.long)[mask])
    fill = -len(ids) % width_multiple
    if fill:  # a sequence of its own, so it changes no real sequence's attention
        ids += [ids[-1]] * fill
        positions += range(fill)
        starts.append(len(ids))
    lengths = [b - a for a, b in zip(starts, starts[1:])]
    return PackedBatch(
        input_ids=_to(torch.tensor([ids], dtype=torch.long), device),
        position_ids=_to(torch.tensor([positions], dtype=torch.long), device),
        cu_seq_lens=_to(torch.tensor(starts, dtype=torch.int32), device),
        max_length=1 << (max(lengths) - 1).bit_length(),
        predicting=_to(torch.cat(predicting), device),
        targets=_to(torch.cat(targets), device),
        loss_inputs=LossInputs.of(samples, width, lambda tensor: _to(tensor, device)),
    )


def _to(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """To the device without waiting for it: a copy from pageable host memory waits for everything queued before
    it (the last micro-batch's backward), and the device would idle while the host then builds the next forward."""
    if device.type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)
