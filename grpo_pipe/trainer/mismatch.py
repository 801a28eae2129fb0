"""How far the trainer's log-probs are from the engine's on the tokens the engine sampled, measured on the
first optimizer pass of a batch (before any update), on the completions that run through the model (with
`trainer.batching.skip_zero_advantage`, those whose advantage is not zero): with a synchronous loop both sides hold the same
weights, so what remains is numerics (kernels, dtypes) or a broken sync. A sync that silently failed shows
here as a number, long before it shows as slow learning."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch

from grpo_pipe.trainer.device_values import read

Scalar = float | torch.Tensor  # a float, or a 0-dim tensor not yet read from the device


@dataclass(kw_only=True)
class MismatchSums:
    """Sums and maxima over completion tokens, added up over micro-batches; `metrics()` turns them into means.
    One micro-batch's are 0-dim tensors until the pass reads them (`total`).

    Args:
        tokens: Completion tokens measured.
        abs_sum: Sum of |log pi_trainer - log pi_sampler|.
        abs_max: Maximum of |log pi_trainer - log pi_sampler|.
        k3_sum: Sum of r - 1 - log r with r = pi_trainer / pi_sampler: KL(sampler || trainer), >= 0.
        ratio_sum: Sum of r.
        ratio_max: Maximum of r.
        outside_clip: Tokens whose r already sits outside the loss's trust region [1 - low, 1 + high].
        clip_tokens: Tokens measured against a trust region (none for a loss that clips no ratio).
        entropy_sum: Sum of the trainer policy's entropy at each completion position (nats).
    """

    tokens: Scalar = 0.0
    abs_sum: Scalar = 0.0
    abs_max: Scalar = 0.0
    k3_sum: Scalar = 0.0
    ratio_sum: Scalar = 0.0
    ratio_max: Scalar = 0.0
    outside_clip: Scalar = 0.0
    clip_tokens: Scalar = 0.0
    entropy_sum: Scalar = 0.0

    @staticmethod
    def total(parts: Sequence[MismatchSums]) -> MismatchSums:
        """The micro-batches' sums added up (and maxima taken), read from the device in one transfer."""
        whole = MismatchSums()
        for part in read(parts):
            whole.add(part)
        return whole

    def add(self, other: MismatchSums) -> None:
        """Adds `other`'s figures, both read already (floats)."""
        for field in fields(self):
            name = field.name
            mine, theirs = getattr(self, name), getattr(other, name)
            setattr(self, name, max(mine, theirs) if name.endswith("_max") else mine + theirs)

    def metrics(self) -> dict[str, float]:
        """Means over the tokens measured, of figures read already (`total`); none when no completion ran through
        the model (all advantages 0)."""
        figures = {f.name: float(getattr(self, f.name)) for f in fields(self)}
        n = figures["tokens"]
        if not n:
            return {}
        return {
            "mismatch/logprob_abs_mean": figures["abs_sum"] / n,
            "mismatch/logprob_abs_max": figures["abs_max"],
            "mismatch/kl_k3": figures["k3_sum"] / n,
            "mismatch/ratio_mean": figures["ratio_sum"] / n,
            "mismatch/ratio_max": figures["ratio_max"],
            "train/entropy": figures["entropy_sum"] / n,
        } | ({"mismatch/outside_clip_fraction": figures["outside_clip"] / figures["clip_tokens"]}
             if figures["clip_tokens"] else {})


def mismatch_sums(
    trainer_logprobs: torch.Tensor,  # [B, T] the trainer's log-probs of the sampled tokens, before any update
    sampler_logprobs: torch.Tensor,  # [B, T] what the engine reported for the same tokens
    mask: torch.Tensor,  # [B, T] 1 on completion tokens
    clip: tuple[float, float] | None,  # (low, high): the loss's trust region; None: the loss clips no ratio
    entropy: torch.Tensor,  # [B, T] the trainer policy's entropy per position
) -> MismatchSums:
    """One micro-batch's sums as 0-dim tensors: masked, never indexed by the mask, so nothing waits for the device
    until the pass reads them all (trainer/device_values.py)."""
    with torch.no_grad():
        on = mask > 0  # [B, T]
        delta = (trainer_logprobs.detach().double() - sampler_logprobs.double()).masked_fill(~on, 0.0)  # [B, T]
        ratio = torch.exp(delta)  # [B, T], 1 off the completion
        tokens = on.sum().double()
        outside = torch.zeros_like(tokens) if clip is None else (
            ((ratio < 1.0 - clip[0]) | (ratio > 1.0 + clip[1])) & on).sum().double()
        return MismatchSums(
            tokens=tokens,
            abs_sum=delta.abs().sum(),
            abs_max=delta.abs().max() if delta.numel() else torch.zeros_like(tokens),
            k3_sum=(ratio - 1.0 - delta).sum(),  # 0 off the completion: exp(0) - 1 - 0
            ratio_sum=(ratio * on).sum(),
            ratio_max=(ratio * on).max() if delta.numel() else torch.zeros_like(tokens),
            outside_clip=outside,
            clip_tokens=torch.zeros_like(tokens) if clip is None else tokens,
            entropy_sum=(entropy.detach().double() * on).sum(),
        )
