"""The GRPO loss family as one small component: advantages, the clipped surrogate, aggregation.

`conf/loss/{grpo,dr_grpo,dapo}.yaml` are presets of this one class; what differs between the papers
is a handful of scalars, not the algorithm.

How this departs from the GRPO paper (Shao et al., 2024):
1. The ratio's reference is a choice (`ratio_reference`):
   - `policy` (default, as TRL and verl): the trainer's own log-probs of the policy as it was when the
     batch arrived (the proximal policy, as in decoupled PPO). With one optimizer pass per batch the ratio
     is 1 with the gradient of log pi, and nothing is clipped by accident. The engine's log-probs differ
     from the trainer's (other kernels, bf16, a policy that lags in async runs); that difference is
     corrected by truncated importance sampling (Yao et al., 2025): each token's loss is weighted by
     min(pi_policy / pi_sampler, is_cap), detached.
   - `sampler`: the engine's sampling log-probs (saves nothing: the proximal log-probs come from the
     first pass's forward). Every token on which engine and trainer disagree by more than the clip range
     loses its gradient before any update: measured on an H100 this removed most of the learning signal
     (docs/loss.md), so it is kept for comparison, not as a default.
   With several optimizer passes over one batch (`trainer.optimisation.updates_per_batch`, GRPO's mu) the ratio is
   taken against the reference above on every pass, so the clip bounds how far all passes together move
   each token.
2. The KL penalty to a frozen reference model (k3 estimator, Schulman 2020) is optional and off by
   default (as in DAPO / Dr.GRPO).
3. Aggregation: `sequence_mean` (GRPO: each completion's tokens averaged over its own length, then
   over completions), `constant` (Dr.GRPO, Liu et al. 2025: summed tokens / (completions x a
   constant budget), no length bias, a loss scale that does not change from step to step) or
   `token_mean` (DAPO, Yu et al. 2025: summed tokens / all tokens of the batch).
4. The group std is the *sample* std (N - 1), as `torch.std`, TRL and the GRPO reference code, so
   advantages compare with theirs. A group whose rewards are all equal gets advantage exactly 0 in
   any dtype: it is detected, never left to float cancellation.
5. Losses are returned pre-divided by the *whole* batch's normaliser, so micro-batch losses summed by
   gradient accumulation give exactly the full-batch gradient.
6. `mask_truncated` (DAPO's overlong filtering): completions that hit the budget without EOS still
   count in their group's advantages, but get no loss and are left out of every normaliser.
7. Two variants, as TRL names them (docs/loss.md has the table):
   - `ratio_level: sequence` (GSPO, Zheng et al. 2025; TRL's `importance_sampling_level="sequence"`): one ratio per
     completion, exp of the mean per-token log-ratio over its tokens, clipped as a whole; `loss=gspo` is the paper's
     setting (clip 3e-4 / 4e-4, per-completion mean).
   - `objective: cispo` (MiniMax-M1 2025; TRL's `loss_type="cispo"`): no clipped surrogate; each token's loss is
     -min(ratio, cispo_max) x advantage x log pi, the ratio detached, so every token keeps a gradient (the clip
     bounds its weight, never removes it); `loss=cispo` averages over the batch's tokens, as TRL does.
8. `aggregation: micro_batch_token_mean` (TRL's `loss_type="bnpo"`): each micro-batch's summed token losses over its
   own model tokens, averaged over the step's micro-batches. Unlike every other aggregation, the step's loss then
   depends on how completions are grouped into micro-batches (here by length; in TRL by generation order), so its
   scale moves with `trainer.batching.micro_batch_size`; `loss=dapo` is the batch-wide token mean. Offered for TRL users who
   reproduce a bnpo run; zero-advantage completions then run too (their tokens count in their micro-batch).
9. An entropy bonus (`entropy_coef`, verl's `entropy_coeff`; off by default): each model token's loss less
   entropy_coef x the policy's entropy at its position, aggregated as the surrogate. It is the one term that still
   has a gradient when every group's rewards are equal, so a policy whose samples have become identical is pushed
   to spread again instead of staying on a plateau that no advantage can leave. `entropy_floor` applies it only to
   completions whose mean entropy per token is below the floor: measured on the calculator task, a bonus on every
   completion raised the entropy at the start, where sparse rewards give no advantage and Adam scales the bonus's
   gradient alone to full steps, until the model wrote noise; a floor leaves a spread policy alone and lifts a
   collapsed one only up to the floor.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch

from grpo_pipe.config.errors import failed
from grpo_pipe.types import LossStats

Aggregation = Literal["sequence_mean", "constant", "token_mean", "micro_batch_token_mean"]
RatioReference = Literal["policy", "sampler"]
RatioLevel = Literal["token", "sequence"]
Objective = Literal["clipped", "cispo"]


def group_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, normalize_std: bool) -> torch.Tensor:
    """Reward minus its group's mean, optionally divided by the group's sample std.

    rewards: [N] float; group_ids: [N] long, equal ids share a prompt. Returns [N].
    A group whose rewards are all equal gets exactly zero advantage (it carries no signal).
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


class GRPOLoss:
    """The clipped-surrogate policy loss with GRPO / Dr.GRPO / DAPO aggregation (see the module docstring)."""

    def __init__(
        self,
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
        ratio_level: RatioLevel = "token",
        objective: Objective = "clipped",
        cispo_max: float = 5.0,
        entropy_coef: float = 0.0,
        entropy_floor: float | None = None,
    ) -> None:
        self.aggregation = aggregation
        self.normalize_std = normalize_std
        self.clip_low = clip_low
        self.clip_high = clip_high
        self.kl_coef = kl_coef
        self.max_tokens = max_tokens  # Dr.GRPO's constant per-completion normaliser (the generation budget)
        self.mask_truncated = mask_truncated
        self.ratio_reference = ratio_reference
        self.is_cap = is_cap
        self.ratio_level = ratio_level
        self.objective = objective
        self.cispo_max = cispo_max  # CISPO's upper bound on a token's (detached) ratio weight: ScaleRL's eps_max
        self.entropy_coef = entropy_coef
        self.entropy_floor = entropy_floor  # the bonus reaches only completions whose mean entropy is below it

    def config_problems(self) -> list[str]:
        return failed(
            (self.clip_low >= 0 and self.clip_high >= 0,
             f"loss.clip_low={self.clip_low}, loss.clip_high={self.clip_high}: must be >= 0"),
            (self.kl_coef >= 0, f"loss.kl_coef={self.kl_coef}: must be >= 0"),
            (self.aggregation != "constant" or (self.max_tokens is not None and self.max_tokens >= 1),
             f"loss.max_tokens={self.max_tokens}: aggregation=constant needs a budget >= 1 (e.g. run.max_new_tokens)"),
            (self.ratio_reference in ("policy", "sampler"),
             f"loss.ratio_reference={self.ratio_reference}: allowed: policy (the trainer's own log-probs, truncated IS "
             "against the sampler), sampler (the engine's sampling log-probs)"),
            (self.is_cap is None or self.is_cap > 0,
             f"loss.is_cap={self.is_cap}: must be > 0, or null for no importance correction"),
            (self.ratio_level in ("token", "sequence"),
             f"loss.ratio_level={self.ratio_level}: allowed: token (a ratio per token), sequence (GSPO: one per completion)"),
            (self.objective in ("clipped", "cispo"),
             f"loss.objective={self.objective}: allowed: clipped (PPO's clipped surrogate), cispo (clipped IS weights)"),
            (self.cispo_max > 0, f"loss.cispo_max={self.cispo_max}: must be > 0"),
            (self.entropy_coef >= 0, f"loss.entropy_coef={self.entropy_coef}: must be >= 0 (0: no entropy bonus)"),
            (self.entropy_floor is None or self.entropy_floor > 0,
             f"loss.entropy_floor={self.entropy_floor}: must be > 0 (nats per token), or null for a bonus on every completion"),
            (self.ratio_reference == "policy" or self.is_cap is None,
             f"loss.is_cap={self.is_cap} with loss.ratio_reference=sampler: the sampler is already the ratio's reference; "
             "set loss.is_cap=null, or loss.ratio_reference=policy"),
        )

    @property
    def needs_reference(self) -> bool:
        return self.kl_coef > 0

    @property
    def needs_every_sample(self) -> bool:
        """Whether a completion whose advantage is 0 must still run: it adds a gradient (the KL term, the entropy
        bonus), or its tokens count in its micro-batch's normaliser (bnpo)."""
        return self.kl_coef > 0 or self.entropy_coef > 0 or self.aggregation == "micro_batch_token_mean"

    def advantages(self, rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        """[N] rewards, [N] group ids -> [N] advantages."""
        return group_advantages(rewards, group_ids, self.normalize_std)

    def normaliser(self, lengths: Sequence[int], micro_batches: int = 1) -> float:
        """What the whole batch's summed loss is divided by. `lengths`: completion lengths of every
        completion that gets a loss (skipped zero-advantage ones included: they add zero, not nothing);
        `micro_batches`: how many the step's are (bnpo averages over them, each over its own tokens)."""
        if self.aggregation == "micro_batch_token_mean":
            return float(max(micro_batches, 1))
        if self.aggregation == "sequence_mean":
            return float(max(len(lengths), 1))
        if self.aggregation == "constant":
            assert self.max_tokens is not None
            return float(max(len(lengths), 1) * self.max_tokens)
        return float(max(sum(lengths), 1))  # token_mean

    def __call__(
        self,
        new_logprobs: torch.Tensor,  # [B, T] log pi_theta(token) for completion tokens
        old_logprobs: torch.Tensor,  # [B, T] log-prob under the engine that sampled the token
        advantages: torch.Tensor,  # [B]
        mask: torch.Tensor,  # [B, T] 1 for completion tokens that get a loss, 0 for padding / masked
        normaliser: float,  # from `normaliser()` over the whole optimizer step
        ref_logprobs: torch.Tensor | None = None,  # [B, T] under the frozen reference, when kl_coef > 0
        proximal_logprobs: torch.Tensor | None = None,  # [B, T] the trainer's, as the batch found the policy
        entropy: torch.Tensor | None = None,  # [B, T] the policy's entropy per position, with its graph, when entropy_coef > 0
    ) -> tuple[torch.Tensor, LossStats]:
        """Loss for one micro-batch, scaled for summing over the micro-batches of one step.

        `proximal_logprobs` defaults to `new_logprobs.detach()` (right for the first optimizer pass)."""
        mask = mask.to(new_logprobs.dtype)
        if self.ratio_reference == "sampler":
            reference = old_logprobs  # [B, T]
            weight = torch.ones_like(new_logprobs)  # [B, T]
        else:
            reference = new_logprobs.detach() if proximal_logprobs is None else proximal_logprobs  # [B, T]
            weight = torch.exp(reference - old_logprobs)  # [B, T] pi_policy / pi_sampler, detached
            if self.is_cap is not None:
                weight = weight.clamp(max=self.is_cap)  # truncated IS
            else:
                weight = torch.ones_like(weight)
        log_ratio = new_logprobs - reference  # [B, T]
        if self.ratio_level == "sequence":  # GSPO: the mean log-ratio of each completion's own tokens
            log_ratio = ((log_ratio * mask).sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True).clamp(min=1.0))
            log_ratio = log_ratio.expand_as(new_logprobs)  # [B, T] one value per completion
        ratio = torch.exp(log_ratio)  # [B, T]
        adv = advantages.unsqueeze(1)  # [B, 1]
        unclipped = ratio * adv  # [B, T]
        clipped = ratio.clamp(1.0 - self.clip_low, 1.0 + self.clip_high) * adv  # [B, T]
        if self.objective == "cispo":  # the weight is clipped and detached; log pi carries the gradient
            clipped = ratio.detach().clamp(max=self.cispo_max) * adv  # [B, T]
            unclipped = ratio.detach() * adv  # [B, T] statistics only: where the cap lowered a positive weight
            per_token = -weight * clipped * new_logprobs  # [B, T]
        else:
            per_token = -weight * torch.minimum(unclipped, clipped)  # [B, T] pessimistic bound, as PPO
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
        summed = per_token * mask  # [B, T]
        if self.aggregation == "sequence_mean":
            loss = (summed.sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)).sum() / normaliser
        elif self.aggregation == "micro_batch_token_mean":  # bnpo: this micro-batch's tokens, then over micro-batches
            loss = summed.sum() / mask.sum().clamp(min=1.0) / normaliser
        else:  # constant and token_mean differ only in the normaliser
            loss = summed.sum() / normaliser
        return loss, self._stats(unclipped, clipped, ratio, weight, kl, adv, mask)

    def _below_floor(self, entropy: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """[B, 1]: 1 for a completion the entropy bonus reaches (its mean entropy per token under the floor), else 0.
        Decided per completion, so the loss of a batch is still the sum of its micro-batches' losses."""
        if self.entropy_floor is None:
            return torch.ones_like(entropy[:, :1])
        mean = (entropy.detach() * mask).sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True).clamp(min=1.0)
        return (mean < self.entropy_floor).to(entropy.dtype)  # [B, 1]

    def _stats(self, unclipped: torch.Tensor, clipped: torch.Tensor, ratio: torch.Tensor, weight: torch.Tensor,
               kl: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor) -> LossStats:
        with torch.no_grad():
            on = mask > 0  # [B, T]
            # The min took the clipped term and it differs: this token's gradient is zero.
            was_clipped = (clipped < unclipped) & on  # [B, T]
            positive, negative = (adv > 0) & on, (adv < 0) & on  # [B, T]
            truncated = (weight >= self.is_cap) & on if self.is_cap is not None else torch.zeros_like(on)
            return LossStats(
                tokens=float(mask.sum()),
                clipped_tokens=float(was_clipped.sum()),
                positive_tokens=float(positive.sum()),
                clipped_positive=float((was_clipped & positive).sum()),
                negative_tokens=float(negative.sum()),
                clipped_negative=float((was_clipped & negative).sum()),
                kl_sum=float((kl * mask).sum()),
                ratio_max=float(ratio.detach()[on].max()) if on.any() else 1.0,
                is_weight_sum=float((weight * mask).sum()),
                is_truncated=float(truncated.sum()),
            )
