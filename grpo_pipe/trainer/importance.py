"""The correction for the engine's sampling mismatch (`loss/correction=`): a detached weight per token.

The engine's log-probs of the tokens it sampled differ from the trainer's (other kernels, bf16, a policy that lags in
async runs). With the ratio taken against the trainer's own log-probs (`loss.ratio_reference=policy`), each token's loss
is multiplied by a weight built from r = pi_trainer / pi_engine, detached. The modes follow TRL 1.16's
`vllm_importance_sampling_mode` and IcePop:

- `token_truncate` (ours by default, cap 2.0; Yao et al., 2025, truncated IS): min(r, cap) per token.
- `token_mask`: r per token, 0 where r > cap.
- `sequence_truncate`: one ratio per completion, exp of the *sum* of its tokens' log-ratios (the likelihood ratio
  of the whole completion, as TRL takes it), min(r_seq, cap) on each of its tokens.
- `sequence_mask` (TRL's default, with cap 3.0): r_seq on each token, the whole completion 0 where r_seq > cap.
- `icepop` (IcePop, Ling team 2025): r per token, 0 where r lies outside the band [low, high], so tokens on which
  trainer and engine disagree in either direction get no gradient.

How this departs from TRL: TRL computes the weight once per batch from the engine's and the trainer's old log-probs;
here it is computed per micro-batch from the proximal log-probs (the trainer's, as the batch found the policy), the
same numbers. `loss.correction=null` uses no weight (needed with `loss.ratio_reference=sampler`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grpo_pipe.config.errors import failed


def token_ratio(trainer_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor) -> torch.Tensor:
    """[B, T] pi_trainer / pi_sampler per token."""
    return torch.exp(trainer_logprobs - sampler_logprobs)  # [B, T]


def sequence_ratio(trainer_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, T] each completion's likelihood ratio (exp of its tokens' summed log-ratios), on each of its positions."""
    summed = ((trainer_logprobs - sampler_logprobs) * mask).sum(dim=1, keepdim=True)  # [B, 1]
    return torch.exp(summed).expand_as(trainer_logprobs)  # [B, T]


def _truncated(ratio: torch.Tensor, cap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """min(ratio, cap), and the tokens the cap reached. [B, T] -> [B, T], [B, T]"""
    weight = ratio.clamp(max=cap)
    return weight, weight >= cap


def _masked(ratio: torch.Tensor, cap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """ratio, 0 where it exceeds cap, and those tokens. [B, T] -> [B, T], [B, T]"""
    over = ratio > cap
    return ratio.masked_fill(over, 0.0), over


@dataclass(kw_only=True)
class CappedRatio:
    """The four modes with one cap (`loss/correction=token_truncate|token_mask|sequence_truncate|sequence_mask`):
    the ratio per token or per completion, truncated at the cap or masked past it.

    Args:
        per_sequence: One ratio per completion, its likelihood ratio r_seq, on each of its tokens; False: r per token.
        masks: A token (or, per sequence, the whole completion) whose ratio exceeds the cap gets weight 0; False: the
            weight is min(ratio, cap), truncated importance sampling.
        cap: The largest weight kept (TRL's default for `sequence_mask`: 3.0; ours for the others: 2.0).
    """

    per_sequence: bool = False
    masks: bool = False
    cap: float = 2.0

    def config_problems(self) -> list[str]:
        return failed((self.cap > 0, f"loss.correction.cap={self.cap}: must be > 0"))

    def weights(self, trainer_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor,
                mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ratio = (sequence_ratio(trainer_logprobs, sampler_logprobs, mask) if self.per_sequence
                 else token_ratio(trainer_logprobs, sampler_logprobs))  # [B, T]
        return _masked(ratio, self.cap) if self.masks else _truncated(ratio, self.cap)


@dataclass(kw_only=True)
class IcePop:
    """r per token, 0 where r is outside [low, high]: both directions of disagreement are masked.

    Args:
        low: The smallest ratio that keeps its token.
        high: The largest ratio that keeps its token.
    """

    low: float = 0.5
    high: float = 2.0

    def config_problems(self) -> list[str]:
        return failed(
            (self.low > 0, f"loss.correction.low={self.low}: must be > 0"),
            (self.high > self.low, f"loss.correction.high={self.high}: must be > loss.correction.low={self.low}"),
        )

    def weights(self, trainer_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor,
                mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ratio = token_ratio(trainer_logprobs, sampler_logprobs)  # [B, T]
        outside = (ratio < self.low) | (ratio > self.high)  # [B, T]
        return ratio.masked_fill(outside, 0.0), outside
