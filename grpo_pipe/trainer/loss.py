"""The GRPO family as objects: one loss (`PolicyGradientLoss`) built from an objective, a sampling correction and an
aggregation. `conf/loss/*.yaml` pick them; what differs between the papers is which objective and which scalars.

The objectives (`Objective`: one per-token term, and the trust region it keeps):
- `ClippedSurrogate`: PPO's clipped surrogate on a ratio per token (GRPO, Dr.GRPO, DAPO, BNPO).
- `SequenceRatio` (GSPO, Zheng et al. 2025; TRL's `importance_sampling_level="sequence"`): one ratio per completion,
  exp of the mean per-token log-ratio over its tokens, clipped as a whole.
- `ClippedWeights` (CISPO, MiniMax-M1 2025; TRL's `loss_type="cispo"`): no clipped surrogate; each token's loss is
  -min(ratio, max_weight) x advantage x log pi, the ratio detached, so every token keeps a gradient.

How this departs from the GRPO paper (Shao et al., 2024):
1. The ratio's reference is a choice (`ratio_reference`):
   - `policy` (default, as TRL and verl): the trainer's own log-probs of the policy as it was when the batch arrived
     (the proximal policy, as in decoupled PPO). With one optimizer pass per batch the ratio is 1 with the gradient of
     log pi, and nothing is clipped by accident. The engine's log-probs differ from the trainer's; that difference is
     corrected by the sampling correction (`loss/correction=`, trainer/importance.py; truncated IS by default).
   - `sampler`: the engine's sampling log-probs. Every token on which engine and trainer disagree by more than the
     clip range loses its gradient before any update: measured on an H100 this removed most of the learning signal
     (docs/loss.md), so it is kept for comparison, not as a default; it takes no correction (`loss.correction=null`).
   With several optimizer passes over one batch (`trainer.optimisation.updates_per_batch`, GRPO's mu) the ratio is
   taken against the reference above on every pass, so the clip bounds how far all passes together move each token.
2. The KL penalty to a frozen reference model (k3 estimator, Schulman 2020) is optional and off by default.
3. Advantages and aggregation: trainer/advantages.py (sample std, exact zeros, four aggregations).
4. `mask_truncated` (DAPO's overlong filtering): completions that hit the budget without EOS still count in their
   group's advantages, but get no loss and are left out of every normaliser.
5. An entropy bonus (`entropy_coef`, verl's `entropy_coeff`; off by default): each model token's loss less
   entropy_coef x the policy's entropy at its position, aggregated as the surrogate. It is the one term that still
   has a gradient when every group's rewards are equal. `entropy_floor` applies it only to completions whose mean
   entropy per token is below the floor: measured on the calculator task, a bonus on every completion raised the
   entropy at the start until the model wrote noise; a floor lifts a collapsed policy only up to the floor.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

import torch

from grpo_pipe.config.errors import failed
from grpo_pipe.interfaces import ChecksItsConfig, SamplingCorrection
from grpo_pipe.trainer.advantages import AGGREGATIONS, Aggregation, aggregate, batch_normaliser, group_advantages
from grpo_pipe.trainer.importance import CappedRatio
from grpo_pipe.types import LossStats

__all__ = ["ClippedSurrogate", "ClippedWeights", "GRPOLoss", "Objective", "PolicyGradientLoss", "SequenceRatio",
           "group_advantages"]

RatioReference = Literal["policy", "sampler"]


@dataclass(frozen=True, kw_only=True)
class Surrogate:
    """One micro-batch's per-token objective and what its statistics read. All [B, T].

    Args:
        per_token: The loss per token, the correction's weight applied, before masking and aggregation.
        unclipped: Ratio x advantage.
        clipped: The bounded term: where it is below `unclipped`, the token was clipped.
        ratio: The ratio the objective used.
    """

    per_token: torch.Tensor
    unclipped: torch.Tensor
    clipped: torch.Tensor
    ratio: torch.Tensor


@runtime_checkable
class Objective(Protocol):
    """The per-token term of a policy-gradient loss, given the ratio's reference and the correction's weight."""

    @property
    def trust_region(self) -> tuple[float, float] | None:
        """(low, high): ratios outside [1 - low, 1 + high] are clipped; None when the objective clips none."""
        ...

    def surrogate(self, new_logprobs: torch.Tensor, reference: torch.Tensor, advantages: torch.Tensor,
                  mask: torch.Tensor, weight: torch.Tensor) -> Surrogate:
        """The per-token loss term, and the ratios it was made of (for the clip statistics).

        Args:
            new_logprobs: [B, T] log pi_theta of the completion tokens, with their graph.
            reference: [B, T] the ratio's reference log-probs, detached.
            advantages: [B] one per completion.
            mask: [B, T] 1 on tokens that get a loss.
            weight: [B, T] the sampling correction's detached weight.
        """
        ...


def _clip(ratio: torch.Tensor, advantages: torch.Tensor, weight: torch.Tensor, low: float, high: float) -> Surrogate:
    adv = advantages.unsqueeze(1)  # [B, 1]
    unclipped = ratio * adv  # [B, T]
    clipped = ratio.clamp(1.0 - low, 1.0 + high) * adv  # [B, T]
    per_token = -weight * torch.minimum(unclipped, clipped)  # [B, T] pessimistic bound, as PPO
    return Surrogate(per_token=per_token, unclipped=unclipped, clipped=clipped, ratio=ratio)


@dataclass(kw_only=True)
class TrustRegion:
    """What the two clipping objectives share: the region [1 - clip_low, 1 + clip_high] their ratio is clipped to,
    and its rule.

    Args:
        clip_low: Ratios below 1 - clip_low are clipped.
        clip_high: Ratios above 1 + clip_high are clipped.
    """

    clip_low: float = 0.2
    clip_high: float = 0.28

    def config_problems(self) -> list[str]:
        return failed((self.clip_low >= 0 and self.clip_high >= 0,
                       f"loss.objective.clip_low={self.clip_low}, loss.objective.clip_high={self.clip_high}: must be >= 0"))

    @property
    def trust_region(self) -> tuple[float, float] | None:
        return (self.clip_low, self.clip_high)


@dataclass(kw_only=True)
class ClippedSurrogate(TrustRegion):
    """PPO's clipped surrogate with a ratio per token.

    Args:
        clip_low: Ratios below 1 - clip_low are clipped.
        clip_high: Ratios above 1 + clip_high are clipped (DAPO's clip-higher when above clip_low).
    """

    clip_low: float = 0.2
    clip_high: float = 0.28

    def surrogate(self, new_logprobs: torch.Tensor, reference: torch.Tensor, advantages: torch.Tensor,
                  mask: torch.Tensor, weight: torch.Tensor) -> Surrogate:
        ratio = torch.exp(new_logprobs - reference)  # [B, T]
        return _clip(ratio, advantages, weight, self.clip_low, self.clip_high)


@dataclass(kw_only=True)
class SequenceRatio(TrustRegion):
    """GSPO: one ratio per completion, exp of the mean log-ratio of its own tokens, clipped as a whole.

    Args:
        clip_low: Sequence ratios below 1 - clip_low are clipped (the paper: 3e-4).
        clip_high: Sequence ratios above 1 + clip_high are clipped (the paper: 4e-4).
    """

    clip_low: float = 3e-4
    clip_high: float = 4e-4

    def surrogate(self, new_logprobs: torch.Tensor, reference: torch.Tensor, advantages: torch.Tensor,
                  mask: torch.Tensor, weight: torch.Tensor) -> Surrogate:
        log_ratio = new_logprobs - reference  # [B, T]
        log_ratio = (log_ratio * mask).sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True).clamp(min=1.0)  # [B, 1]
        ratio = torch.exp(log_ratio.expand_as(new_logprobs))  # [B, T] one value per completion
        return _clip(ratio, advantages, weight, self.clip_low, self.clip_high)


@dataclass(kw_only=True)
class ClippedWeights:
    """CISPO: each token's loss is -min(ratio, max_weight) x advantage x log pi, the ratio detached.

    Args:
        max_weight: The cap on a token's ratio weight (ScaleRL's eps_max; TRL: epsilon_high=5.0 with cispo).
    """

    max_weight: float = 5.0

    def config_problems(self) -> list[str]:
        return failed((self.max_weight > 0, f"loss.objective.max_weight={self.max_weight}: must be > 0"))

    @property
    def trust_region(self) -> tuple[float, float] | None:
        return None  # the cap bounds a weight; no token is clipped out of the gradient

    def surrogate(self, new_logprobs: torch.Tensor, reference: torch.Tensor, advantages: torch.Tensor,
                  mask: torch.Tensor, weight: torch.Tensor) -> Surrogate:
        ratio = torch.exp(new_logprobs - reference)  # [B, T]
        adv = advantages.unsqueeze(1)  # [B, 1]
        clipped = ratio.detach().clamp(max=self.max_weight) * adv  # [B, T] the weight is clipped and detached
        unclipped = ratio.detach() * adv  # [B, T] statistics only: where the cap lowered a positive weight
        per_token = -weight * clipped * new_logprobs  # [B, T] log pi carries the gradient
        return Surrogate(per_token=per_token, unclipped=unclipped, clipped=clipped, ratio=ratio)


@dataclass(kw_only=True)
class PolicyGradientLoss:
    """Group advantages, an objective, the sampling correction, KL and entropy terms, one aggregation.

    Args:
        objective: The per-token term (`ClippedSurrogate`, `SequenceRatio`, `ClippedWeights`).
        correction: The weight for the engine's sampling mismatch (trainer/importance.py); None: no weight.
        aggregation: How token losses become the batch's loss (trainer/advantages.py).
        normalize_std: Divide advantages by the group's sample std (GRPO); False: Dr.GRPO.
        kl_coef: > 0: a k3 KL term to the frozen starting policy.
        max_tokens: The constant per-completion normaliser of `aggregation=constant` (the generation budget).
        mask_truncated: Completions that hit the budget without EOS get no loss (DAPO).
        ratio_reference: `policy` (the trainer's proximal log-probs) or `sampler` (the engine's).
        entropy_coef: > 0: an entropy bonus per model token.
        entropy_floor: The bonus only for completions whose mean entropy per token is below this (nats); None: all.
    """

    objective: Objective
    correction: SamplingCorrection | None = None
    aggregation: Aggregation = "sequence_mean"
    normalize_std: bool = True
    kl_coef: float = 0.0
    max_tokens: int | None = None
    mask_truncated: bool = False
    ratio_reference: RatioReference = "policy"
    entropy_coef: float = 0.0
    entropy_floor: float | None = None

    def config_problems(self) -> list[str]:
        own = failed(
            (self.kl_coef >= 0, f"loss.kl_coef={self.kl_coef}: must be >= 0"),
            (self.aggregation in AGGREGATIONS, f"loss.aggregation={self.aggregation}: allowed: {', '.join(AGGREGATIONS)}"),
            (self.aggregation != "constant" or (self.max_tokens is not None and self.max_tokens >= 1),
             f"loss.max_tokens={self.max_tokens}: aggregation=constant needs a budget >= 1 (e.g. run.max_new_tokens)"),
            (self.ratio_reference in ("policy", "sampler"),
             f"loss.ratio_reference={self.ratio_reference}: allowed: policy (the trainer's own log-probs, corrected "
             "against the sampler), sampler (the engine's sampling log-probs)"),
            (self.entropy_coef >= 0, f"loss.entropy_coef={self.entropy_coef}: must be >= 0 (0: no entropy bonus)"),
            (self.entropy_floor is None or self.entropy_floor > 0,
             f"loss.entropy_floor={self.entropy_floor}: must be > 0 (nats per token), or null for a bonus on every completion"),
            (self.ratio_reference == "policy" or self.correction is None,
             f"loss.correction ({type(self.correction).__name__}) with loss.ratio_reference=sampler: the sampler is "
             "already the ratio's reference; set loss.correction=null, or loss.ratio_reference=policy"),
        )
        parts = [p.config_problems() for p in (self.objective, self.correction) if isinstance(p, ChecksItsConfig)]
        return own + [problem for found in parts for problem in found]

    @property
    def needs_reference(self) -> bool:
        return self.kl_coef > 0

    @property
    def needs_every_sample(self) -> bool:
        """Whether a completion whose advantage is 0 must still run: it adds a gradient (the KL term, the entropy
        bonus), or its tokens count in its micro-batch's normaliser (bnpo)."""
        return self.kl_coef > 0 or self.entropy_coef > 0 or self.aggregation == "micro_batch_token_mean"

    @property
    def needs_entropy(self) -> bool:
        return self.entropy_coef > 0

    @property
    def masks_truncated(self) -> bool:
        return self.mask_truncated

    @property
    def trust_region(self) -> tuple[float, float] | None:
        return self.objective.trust_region

    def advantages(self, rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        """[N] rewards, [N] group ids -> [N] advantages."""
        return group_advantages(rewards, group_ids, self.normalize_std)

    def normaliser(self, lengths: Sequence[int], micro_batches: int = 1) -> float:
        return batch_normaliser(self.aggregation, lengths, micro_batches, self.max_tokens)

    def __call__(
        self,
        new_logprobs: torch.Tensor,  # [B, T] log pi_theta(token) for completion tokens
        old_logprobs: torch.Tensor,  # [B, T] log-prob under the engine that sampled the token
        advantages: torch.Tensor,  # [B]
        mask: torch.Tensor,  # [B, T] 1 for completion tokens that get a loss, 0 for padding / masked
        normaliser: float,  # from `normaliser()` over the whole optimizer step
        ref_logprobs: torch.Tensor | None = None,  # [B, T] under the frozen reference, when kl_coef > 0
        proximal_logprobs: torch.Tensor | None = None,  # [B, T] the trainer's, as the batch found the policy
        entropy: torch.Tensor | None = None,  # [B, T] the policy's entropy per position, with its graph
    ) -> tuple[torch.Tensor, LossStats]:
        """Loss for one micro-batch, scaled for summing over the micro-batches of one step.

        `proximal_logprobs` defaults to `new_logprobs.detach()` (right for the first optimizer pass)."""
        mask = mask.to(new_logprobs.dtype)
        if self.ratio_reference == "sampler":
            reference = old_logprobs  # [B, T]
        else:
            reference = new_logprobs.detach() if proximal_logprobs is None else proximal_logprobs  # [B, T]
        if self.ratio_reference == "policy" and self.correction is not None:
            weight, corrected = self.correction.weights(reference, old_logprobs, mask)  # [B, T] detached, [B, T]
        else:
            weight, corrected = torch.ones_like(new_logprobs), torch.zeros_like(mask, dtype=torch.bool)
        term = self.objective.surrogate(new_logprobs, reference, advantages, mask, weight)
        per_token = term.per_token  # [B, T]
        kl = torch.zeros_like(per_token)  # [B, T]
        if self.kl_coef > 0:
            if ref_logprobs is None:
                raise ValueError("loss.kl_coef > 0 but no reference log-probs were given")
            log_ratio_ref = ref_logprobs - new_logprobs  # [B, T]
            kl = torch.exp(log_ratio_ref) - log_ratio_ref - 1.0  # [B, T] k3 estimator, >= 0
            per_token = per_token + self.kl_coef * kl
        if self.entropy_coef > 0:
            if entropy is None:
                raise ValueError("loss.entropy_coef > 0 but no entropy was given")
            per_token = per_token - self.entropy_coef * entropy * self._below_floor(entropy, mask)
        loss = aggregate(per_token * mask, mask, self.aggregation, normaliser)
        return loss, _stats(term, weight, corrected, kl, advantages.unsqueeze(1), mask)

    def _below_floor(self, entropy: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """[B, 1]: 1 for a completion the entropy bonus reaches (its mean entropy per token under the floor), else 0.
        Decided per completion, so the loss of a batch is still the sum of its micro-batches' losses."""
        if self.entropy_floor is None:
            return torch.ones_like(entropy[:, :1])
        mean = (entropy.detach() * mask).sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True).clamp(min=1.0)
        return (mean < self.entropy_floor).to(entropy.dtype)  # [B, 1]


def _stats(term: Surrogate, weight: torch.Tensor, corrected: torch.Tensor, kl: torch.Tensor, adv: torch.Tensor,
           mask: torch.Tensor) -> LossStats:
    with torch.no_grad():
        on = mask > 0  # [B, T]
        # The min took the clipped term and it differs: this token's gradient is zero.
        was_clipped = (term.clipped < term.unclipped) & on  # [B, T]
        positive, negative = (adv > 0) & on, (adv < 0) & on  # [B, T]
        ratio = term.ratio.detach().masked_fill(~on, -math.inf).max()  # -inf when nothing is scored
        # 0-dim tensors: the trainer reads a whole pass's statistics at once (trainer/device_values.py).
        return LossStats(
            tokens=mask.sum(),
            clipped_tokens=was_clipped.sum(),
            positive_tokens=positive.sum(),
            clipped_positive=(was_clipped & positive).sum(),
            negative_tokens=negative.sum(),
            clipped_negative=(was_clipped & negative).sum(),
            kl_sum=(kl * mask).sum(),
            ratio_max=torch.where(on.any(), ratio, torch.ones_like(ratio)),
            is_weight_sum=(weight * mask).sum(),
            is_truncated=(corrected & on).sum(),
        )


def GRPOLoss(  # noqa: N802 the name the family's loss had as one class: a thin way to build it from flat settings
    *,
    aggregation: Aggregation = "sequence_mean",
    normalize_std: bool = True,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    kl_coef: float = 0.0,
    max_tokens: int | None = None,
    mask_truncated: bool = False,
    ratio_reference: RatioReference = "policy",
    is_cap: float | None = 2.0,
    ratio_level: Literal["token", "sequence"] = "token",
    objective: Literal["clipped", "cispo"] = "clipped",
    cispo_max: float = 5.0,
    entropy_coef: float = 0.0,
    entropy_floor: float | None = None,
) -> PolicyGradientLoss:
    """The family's loss from the flat settings of one class: `objective=cispo` is `ClippedWeights`,
    `ratio_level=sequence` is `SequenceRatio`, `is_cap` a per-token truncating `CappedRatio` (None: no correction).

    Args:
        aggregation: How token terms become the loss, as `PolicyGradientLoss.aggregation`.
        normalize_std: Divide each group's advantages by its standard deviation (GRPO); False: Dr.GRPO.
        clip_low: The trust region's lower side: ratios under 1 - clip_low are clipped.
        clip_high: Its upper side (DAPO's clip-higher when above `clip_low`).
        kl_coef: Weight of the KL penalty to the reference policy; 0: none.
        max_tokens: The constant normaliser of `aggregation=constant` (Dr.GRPO's).
        mask_truncated: Completions cut by the token budget get no loss (DAPO's overlong filtering).
        ratio_reference: What the ratio is taken against, as `PolicyGradientLoss.ratio_reference`.
        is_cap: The per-token truncating correction's cap (`CappedRatio`); None: no correction.
        ratio_level: `token` (PPO's ratio per token) or `sequence` (GSPO's `SequenceRatio`).
        objective: `clipped` (the surrogate) or `cispo` (`ClippedWeights`).
        cispo_max: CISPO's cap on the detached weight.
        entropy_coef: Weight of the entropy bonus; 0: none.
        entropy_floor: The bonus only for completions whose mean entropy per token is below this (nats); None: all.
    """
    chosen: Objective
    if objective == "cispo":
        chosen = ClippedWeights(max_weight=cispo_max)
    elif ratio_level == "sequence":
        chosen = SequenceRatio(clip_low=clip_low, clip_high=clip_high)
    else:
        chosen = ClippedSurrogate(clip_low=clip_low, clip_high=clip_high)
    return PolicyGradientLoss(
        objective=chosen, correction=None if is_cap is None else CappedRatio(cap=is_cap), aggregation=aggregation,
        normalize_std=normalize_std, kl_coef=kl_coef, max_tokens=max_tokens, mask_truncated=mask_truncated,
        ratio_reference=ratio_reference, entropy_coef=entropy_coef, entropy_floor=entropy_floor,
    )
