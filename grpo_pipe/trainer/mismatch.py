"""How far the trainer's log-probs are from the engine's on the tokens the engine sampled, measured on the
first optimizer pass of a batch (before any update), on the completions that run through the model (with
`trainer.batching.skip_zero_advantage`, those whose advantage is not zero): with a synchronous loop both sides hold the same
weights, so what remains is numerics (kernels, dtypes) or a broken sync. A sync that silently failed shows
here as a number, long before it shows as slow learning."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch


@dataclass
class MismatchSums:
    """Sums and maxima over completion tokens, added up over micro-batches; `metrics()` turns them into means."""

    tokens: float = 0.0
    abs_sum: float = 0.0  # |log pi_trainer - log pi_sampler|
    abs_max: float = 0.0
    k3_sum: float = 0.0  # r - 1 - log r with r = pi_trainer / pi_sampler: KL(sampler || trainer), >= 0
    ratio_sum: float = 0.0  # r
    ratio_max: float = 0.0
    outside_clip: float = 0.0  # tokens whose r already sits outside the loss's trust region [1 - low, 1 + high]
    clip_tokens: float = 0.0  # tokens measured against a trust region (none for a loss that clips no ratio)
    entropy_sum: float = 0.0  # the trainer policy's entropy at each completion position (nats)

    def add(self, other: MismatchSums) -> None:
        for field in fields(self):
            name = field.name
            mine, theirs = getattr(self, name), getattr(other, name)
            setattr(self, name, max(mine, theirs) if name.endswith("_max") else mine + theirs)

    def metrics(self) -> dict[str, float]:
        """Means over the tokens measured; none when no completion ran through the model (all advantages 0)."""
        if not self.tokens:
            return {}
        n = self.tokens
        return {
            "mismatch/logprob_abs_mean": self.abs_sum / n,
            "mismatch/logprob_abs_max": self.abs_max,
            "mismatch/kl_k3": self.k3_sum / n,
            "mismatch/ratio_mean": self.ratio_sum / n,
            "mismatch/ratio_max": self.ratio_max,
            "train/entropy": self.entropy_sum / n,
        } | ({"mismatch/outside_clip_fraction": self.outside_clip / self.clip_tokens} if self.clip_tokens else {})


def mismatch_sums(
    trainer_logprobs: torch.Tensor,  # [B, T] the trainer's log-probs of the sampled tokens, before any update
    sampler_logprobs: torch.Tensor,  # [B, T] what the engine reported for the same tokens
    mask: torch.Tensor,  # [B, T] 1 on completion tokens
    clip: tuple[float, float] | None,  # (low, high): the loss's trust region; None: the loss clips no ratio
    entropy: torch.Tensor,  # [B, T] the trainer policy's entropy per position
) -> MismatchSums:
    with torch.no_grad():
        on = mask > 0  # [B, T]
        delta = (trainer_logprobs.detach().double() - sampler_logprobs.double())[on]  # [n]
        if delta.numel() == 0:
            return MismatchSums()
        ratio = torch.exp(delta)  # [n]
        outside = 0.0 if clip is None else float(((ratio < 1.0 - clip[0]) | (ratio > 1.0 + clip[1])).sum())
        return MismatchSums(
            tokens=float(delta.numel()),
            abs_sum=float(delta.abs().sum()),
            abs_max=float(delta.abs().max()),
            k3_sum=float((ratio - 1.0 - delta).sum()),
            ratio_sum=float(ratio.sum()),
            ratio_max=float(ratio.max()),
            outside_clip=outside,
            clip_tokens=0.0 if clip is None else float(delta.numel()),
            entropy_sum=float(entropy.detach().double()[on].sum()),
        )
