"""How one batch becomes passes through the model: which completions get a forward pass, cut into micro-batches
(packed by a token budget, or padded by a count), with the statistics a pass gives.

The trainer (trainer/grpo.py) runs a plan; the sharded trainer hands each rank its share of one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from grpo_pipe.interfaces import PolicyLoss
from grpo_pipe.trainer.batch import TrainSample, flatten
from grpo_pipe.trainer.device_values import read
from grpo_pipe.trainer.packing import sequence_tokens, token_budget_cuts
from grpo_pipe.types import LossStats, RolloutGroup


def micro_batches(count: int, size: int) -> list[range]:
    """`count` samples in the fewest micro-batches of at most `size`, as even as possible (65 at 64 = 32 + 33,
    not 64 + 1): the last one is never a sliver that costs a whole pass of kernel launches, or a batch of one,
    which a compiled graph would trace again."""
    if count == 0:
        return []
    parts = -(-count // size)
    bounds = [round(i * count / parts) for i in range(parts + 1)]
    return [range(a, b) for a, b in zip(bounds, bounds[1:])]


def default_max_tokens() -> int:
    """Tokens per packed forward/backward when the config leaves it open and nothing was measured (a sharded rank;
    one GPU measures its own in set-up, trainer/token_budget.py): 16 k on a GPU, 4 k on a CPU (about what 8 padded
    sequences of the default job hold; more only costs memory there)."""
    return 16384 if torch.cuda.is_available() else 4096


def default_micro_batch_size() -> int:
    """Sequences per forward/backward when the config leaves it open. On a GPU the update is bound by
    kernel launches, not arithmetic: 16 halves its time against 8 on an H100 (0.5B); a CPU gains nothing
    from larger micro-batches, only padding."""
    return 16 if torch.cuda.is_available() else 8


def make_plan(groups: Sequence[RolloutGroup], rewards: Sequence[float], loss: PolicyLoss, *, skip_zero_advantage: bool,
              packed: bool, max_tokens: int, micro_batch_size: int) -> BatchPlan:
    """Advantages, which completions get a loss, which of those need a forward pass, the normaliser."""
    reward_t = torch.tensor(rewards, dtype=torch.float32)  # [N]
    group_ids = torch.repeat_interleave(torch.arange(len(groups)), torch.tensor([len(g.completions) for g in groups]))
    advantages = loss.advantages(reward_t, group_ids)  # [N]
    samples = flatten(groups, advantages.tolist())
    counted = [s for s in samples if not (loss.masks_truncated and s.truncated)]
    # A zero advantage adds exactly nothing to the surrogate, so its forward/backward is skipped; it still counts
    # in the normaliser. The KL term and the entropy bonus are not zero for it, and bnpo counts its tokens in its
    # micro-batch's normaliser: then everything runs.
    skip = skip_zero_advantage and not loss.needs_every_sample
    active = [s for s in counted if s.advantage != 0.0 or not skip]
    # Similar lengths share a micro-batch, so padding stays small.
    ordered = sorted(active, key=sequence_tokens)
    cuts = token_budget_cuts(ordered, max_tokens) if packed else micro_batches(len(ordered), micro_batch_size)
    # environment tokens are in no normaliser
    normaliser = loss.normaliser([s.trained_tokens for s in counted], micro_batches=len(cuts))
    return BatchPlan(active=ordered, normaliser=normaliser, samples=len(samples), masked=len(samples) - len(counted),
                     advantages=advantages, cuts=cuts)


@dataclass(frozen=True, kw_only=True)
class BatchPlan:
    """One batch as the loss sees it.

    Args:
        active: Completions run through the model, length-sorted.
        normaliser: The whole batch's loss normaliser (see PolicyLoss.normaliser)
        samples: Completions in the batch.
        masked: Completions given no loss (mask_truncated)
        advantages: [samples].
        cuts: The micro-batches: index ranges of `active`, in order.
    """

    active: list[TrainSample]
    normaliser: float
    samples: int
    masked: int
    advantages: torch.Tensor
    cuts: list[range]

    def metrics(self) -> dict[str, float]:
        return {
            "train/active_samples": float(len(self.active)),
            "train/samples": float(self.samples),
            "train/masked_truncated": float(self.masked),
            "train/advantage_abs_mean": float(self.advantages.abs().mean()),
        }


@dataclass
class PassCache:
    """What the first optimizer pass over a batch saw, per micro-batch, for the passes after it.

    Args:
        reference: [B, T] frozen reference (KL), or None.
        proximal: [B, T] the policy before this batch's updates.
    """

    reference: list[torch.Tensor | None] = field(default_factory=list)
    proximal: list[torch.Tensor] = field(default_factory=list)


def loss_metrics(stats: Sequence[LossStats]) -> dict[str, float]:
    """One pass's loss statistics over its micro-batches: shares of tokens, by the sign of the advantage. Read from
    the device here, in one transfer, once the pass is over."""
    stats = read(stats)

    def share(part: float, whole: float) -> float:
        return part / whole if whole else 0.0

    total: dict[str, float] = {name: float(sum(getattr(s, name) for s in stats))
                               for name in LossStats.__dataclass_fields__ if name != "is_weight_sum"}
    total["is_weight_sum"] = float(sum(s.tokens if s.is_weight_sum is None else s.is_weight_sum for s in stats))
    return {
        "train/clip_fraction": share(total["clipped_tokens"], total["tokens"]),
        "train/clip_fraction/positive": share(total["clipped_positive"], total["positive_tokens"]),
        "train/clip_fraction/negative": share(total["clipped_negative"], total["negative_tokens"]),
        "train/ratio_max": max((float(s.ratio_max) for s in stats), default=1.0),
        "train/tokens": total["tokens"],
        "train/kl": share(total["kl_sum"], total["tokens"]),
        "train/is_weight_mean": share(total["is_weight_sum"], total["tokens"]) if total["tokens"] else 1.0,
        "train/is_truncated_fraction": share(total["is_truncated"], total["tokens"]),
    }
