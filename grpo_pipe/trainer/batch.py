"""Turn rollout groups into padded training tensors, and the loss's inputs that padded and packed micro-batches share."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch

from grpo_pipe.types import RolloutGroup


@dataclass(frozen=True, kw_only=True)
class TrainSample:
    """One completion ready for the loss: prompt + completion ids and what the engine reported.

    Args:
        prompt_ids: [P] the prompt's token ids, as the engine saw them.
        completion_ids: [T] the completion's token ids, as the engine returned them.
        sampling_logprobs: [T] the engine's log-probs of those tokens.
        advantage: The completion's advantage, from its group's rewards.
        policy_version: The policy version that sampled it.
        truncated: It hit the generation budget without EOS (finish_reason "length").
        loss_mask: [T] True on tokens the engine sampled, False on an episode's environment tokens (no loss);
            None: all sampled.
    """

    prompt_ids: tuple[int, ...]  # [P]
    completion_ids: tuple[int, ...]  # [T]
    sampling_logprobs: tuple[float, ...]  # [T]
    advantage: float
    policy_version: int
    truncated: bool = False
    loss_mask: tuple[bool, ...] | None = None  # [T]

    @property
    def trained_tokens(self) -> int:
        """Tokens that get a loss: the whole completion, or an episode's model turns."""
        return len(self.completion_ids) if self.loss_mask is None else sum(self.loss_mask)


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
                    loss_mask=completion.sampled_by_model,
                )
            )
            index += 1
    return samples


@dataclass(frozen=True, kw_only=True)
class LossInputs:
    """What the loss reads of a micro-batch: one row per completion, the same tensors whether the model's input was
    padded (`MicroBatch`) or packed (`PackedBatch`), so the loss, the mismatch metrics and the scores' shape do not
    depend on the batching.

    Args:
        completion_mask: [B, T] 1 on completion tokens the model sampled (0 on padding, environment tokens).
        sampling_logprobs: [B, T] the engine's log-probs of those tokens (0 on padding).
        advantages: [B].
    """

    completion_mask: torch.Tensor
    sampling_logprobs: torch.Tensor
    advantages: torch.Tensor

    @classmethod
    def of(cls, samples: Sequence[TrainSample], width: int,
           move: Callable[[torch.Tensor], torch.Tensor]) -> LossInputs:
        """The loss's inputs of `samples`, built on the host and handed to `move` (to the device).

        Args:
            samples: One row each, in order.
            width: T, at least the longest completion; the columns past a completion are padding.
            move: Takes each host tensor to where the loss runs.
        """
        completion_mask = torch.zeros((len(samples), width), dtype=torch.float32)  # [B, T]
        logprobs = torch.zeros((len(samples), width), dtype=torch.float32)  # [B, T]
        for row, sample in enumerate(samples):
            count = len(sample.completion_ids)
            if sample.loss_mask is None:
                completion_mask[row, :count] = 1.0
            else:  # an episode: the environment's tokens are context, never trained on
                completion_mask[row, :count] = torch.tensor(sample.loss_mask, dtype=torch.float32)
            logprobs[row, :count] = torch.tensor(sample.sampling_logprobs, dtype=torch.float32)
        return cls(completion_mask=move(completion_mask), sampling_logprobs=move(logprobs),
                   advantages=move(torch.tensor([s.advantage for s in samples], dtype=torch.float32)))  # [B]

    @property
    def width(self) -> int:
        """T: the completion columns."""
        return self.completion_mask.shape[1]


@dataclass(frozen=True, kw_only=True)
class MicroBatch:
    """Every completion starts at the same column, so the model projects only the completion positions to the
    vocabulary. A shorter prompt is filled up to that column by repeating its last token, masked out as a key
    (`collate` says why).

    Args:
        input_ids: [B, P + T] prompt, last prompt token.., completion, ..pad.
        attention_mask: [B, P + T].
        position_ids: [B, P + T] each row counts from 0 at its first prompt token, as the engine did.
        loss_inputs: The completions' mask, sampling log-probs and advantages, [B, T] and [B].
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    loss_inputs: LossInputs

    @property
    def completion_ids(self) -> torch.Tensor:
        """[B, T] the completion tokens (the last T columns)."""
        return self.input_ids[:, -self.loss_inputs.width :]

    def model_inputs(self, logits_to_keep: bool) -> dict[str, Any]:
        """Keyword arguments of a causal LM's forward whose logits are read by `completion_logprobs`.

        `logits_to_keep`: the model takes Hugging Face's `logits_to_keep` (then it projects only the
        T + 1 last positions to the vocabulary, not the prompt's), and so its `use_cache`, which is turned
        off: a training forward has no use for a KV cache, and filling one copies every layer's keys and
        values (and makes a compiled layer trace again once the cache exists)."""
        inputs: dict[str, Any] = dict(
            input_ids=self.input_ids, attention_mask=self.attention_mask, position_ids=self.position_ids
        )
        if logits_to_keep:
            inputs["logits_to_keep"] = self.loss_inputs.width + 1
            inputs["use_cache"] = False
        return inputs


def collate(samples: Sequence[TrainSample], pad_id: int, device: torch.device, width_multiple: int = 1) -> MicroBatch:
    """One micro-batch: each prompt from column 0, its last token repeated up to the widest prompt's end, then the
    completion, right-padded. `width_multiple`: the whole width (prompt + completion) is padded up to a multiple of
    it. Compiled layers ask for 8: the compiler specialises a graph on whether the sequence length is 8-aligned, so
    a batch of the other kind would compile again mid-run (seconds each).

    Why not left padding: a left pad's query attends to no key at all (causally it sees only pads, all masked), a known
    source of NaN in attention's backward pass, which 0 x NaN carries into every weight's gradient while the loss, which
    never reads those rows, stays finite. On a GPU, left-padded micro-batches gave exactly that (random-init
    Qwen2.5-0.5B, compiled layers: three steps of four) where micro-batches without padding did not (BENCHMARKS.md).
    Here every query sees the prompt's first token. The repeats are masked as keys, so no real token sees them, and
    each has its prompt's last token and position (`attention.cumsum`) and sees exactly that token's keys: the
    column before the completion computes what the prompt's last token does, and its logits score the first
    completion token."""
    prompt_width = max(len(s.prompt_ids) for s in samples)
    width = max(max(len(s.completion_ids) for s in samples), 1)
    width += -(prompt_width + width) % width_multiple  # extra padding columns, masked like any padding
    batch = len(samples)
    input_ids = torch.full((batch, prompt_width + width), pad_id, dtype=torch.long)
    attention = torch.zeros((batch, prompt_width + width), dtype=torch.long)
    for row, sample in enumerate(samples):
        prompt_end, completion_end = len(sample.prompt_ids), prompt_width + len(sample.completion_ids)
        input_ids[row, :prompt_end] = torch.tensor(sample.prompt_ids, dtype=torch.long)
        input_ids[row, prompt_end:prompt_width] = sample.prompt_ids[-1] if sample.prompt_ids else pad_id
        input_ids[row, prompt_width:completion_end] = torch.tensor(sample.completion_ids, dtype=torch.long)
        attention[row, :prompt_end] = 1
        attention[row, prompt_width:completion_end] = 1
    positions = (attention.cumsum(dim=1) - 1).clamp(min=0)  # [B, P + T] a repeat keeps its prompt's last position
    return MicroBatch(
        input_ids=input_ids.to(device),
        attention_mask=attention.to(device),
        position_ids=positions.to(device),
        loss_inputs=LossInputs.of(samples, width, lambda tensor: tensor.to(device)),
    )


# fp32 log-softmax elements held at once (1 GiB); larger batches are done in row chunks, each
# recomputed in the backward pass instead of keeping [B, T, V] fp32 activations alive.
LOGSOFTMAX_CHUNK_ELEMENTS = 2**28


def completion_logprobs(logits: torch.Tensor, batch: MicroBatch, temperature: float) -> torch.Tensor:
    """log pi(token) of each completion token at `temperature`. logits: [B, K, V] of the last K >= T + 1
    positions (the model's output for `batch.model_inputs`) -> [B, T].

    Position p's logits predict token p + 1, so the T completion tokens are read from the T positions
    before the last one."""
    logits = logits[:, -(batch.loss_inputs.width + 1) : -1]  # [B, T, V]
    targets = batch.completion_ids  # [B, T]
    rows = max(1, LOGSOFTMAX_CHUNK_ELEMENTS // max(logits.shape[1] * logits.shape[2], 1))
    if rows >= logits.shape[0] or not torch.is_grad_enabled():
        return _token_logprobs(logits, targets, temperature) * batch.loss_inputs.completion_mask
    from torch.utils.checkpoint import checkpoint

    chunks = [
        cast(torch.Tensor, checkpoint(_token_logprobs, logits[i : i + rows], targets[i : i + rows], temperature,
                                      use_reentrant=False))
        for i in range(0, logits.shape[0], rows)
    ]
    return torch.cat(chunks) * batch.loss_inputs.completion_mask  # [B, T]


def _token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """[b, T, V] logits, [b, T] token ids -> [b, T] log-softmax at the tokens, in fp32."""
    scaled = logits.float() / temperature  # [b, T, V]
    return scaled.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - scaled.logsumexp(dim=-1)


def completion_entropy(logits: torch.Tensor, batch: MicroBatch, temperature: float, grad: bool = False) -> torch.Tensor:
    """The policy's entropy (nats) at each completion position, at `temperature`. logits: [B, K, V] as for
    `completion_logprobs` -> [B, T]. Rows are done in chunks of the same size as the log-softmax, so no [B, T, V]
    fp32 copy is held at once; with `grad` (the entropy bonus) each chunk is recomputed in the backward pass."""
    logits = logits[:, -(batch.loss_inputs.width + 1) : -1]  # [B, T, V]
    rows = max(1, LOGSOFTMAX_CHUNK_ELEMENTS // max(logits.shape[1] * logits.shape[2], 1))
    if not grad:
        with torch.no_grad():
            parts = [_token_entropy(logits[i : i + rows].detach(), temperature) for i in range(0, logits.shape[0], rows)]
    else:
        from torch.utils.checkpoint import checkpoint

        parts = [cast(torch.Tensor, checkpoint(_token_entropy, logits[i : i + rows], temperature, use_reentrant=False))
                 for i in range(0, logits.shape[0], rows)]
    return torch.cat(parts) * batch.loss_inputs.completion_mask  # [B, T]


def _token_entropy(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """[b, T, V] logits -> [b, T] entropy of the softmax at `temperature`, in fp32."""
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)  # [b, T, V]
    return -(logp.exp() * logp).sum(dim=-1)
