"""Statistics stay on the device until a pass ends: the same figures as reading them at once, read in one transfer."""

from __future__ import annotations

import pytest
import torch

from grpo_pipe.trainer.batch_plan import loss_metrics
from grpo_pipe.trainer.device_values import read
from grpo_pipe.trainer.loss import GRPOLoss
from grpo_pipe.trainer.mismatch import MismatchSums, mismatch_sums
from grpo_pipe.types import LossStats


def test_read_replaces_every_tensor_field_and_keeps_the_rest() -> None:
    stats = [LossStats(tokens=torch.tensor(3.0), kl_sum=torch.tensor(0.5)), LossStats(tokens=2.0, is_weight_sum=None)]
    first, second = read(stats)
    assert (first.tokens, first.kl_sum, first.clipped_tokens) == (3.0, 0.5, 0.0)
    assert all(type(v) is float for v in (first.tokens, first.kl_sum))
    assert second == stats[1]


def _old_mismatch(trainer: torch.Tensor, sampler: torch.Tensor, mask: torch.Tensor, entropy: torch.Tensor,
                  clip: tuple[float, float]) -> dict[str, float]:
    """The figures as the trainer read them before (indexing by the mask, one read per figure)."""
    on = mask > 0
    delta = (trainer.double() - sampler.double())[on]
    ratio = torch.exp(delta)
    n = float(delta.numel())
    return {
        "mismatch/logprob_abs_mean": float(delta.abs().sum()) / n,
        "mismatch/logprob_abs_max": float(delta.abs().max()),
        "mismatch/kl_k3": float((ratio - 1.0 - delta).sum()) / n,
        "mismatch/ratio_mean": float(ratio.sum()) / n,
        "mismatch/ratio_max": float(ratio.max()),
        "train/entropy": float(entropy.double()[on].sum()) / n,
        "mismatch/outside_clip_fraction": float(((ratio < 1 - clip[0]) | (ratio > 1 + clip[1])).sum()) / n,
    }


def test_masked_mismatch_sums_over_micro_batches_equal_the_indexed_ones() -> None:
    """Three micro-batches, one of them with nothing scored (a sharded rank's padding pass)."""
    gen = torch.Generator().manual_seed(0)
    parts, whole = [], []
    for rows, masked_out in ((3, False), (2, True), (4, False)):
        trainer = -torch.rand(rows, 7, generator=gen) * 3
        sampler = trainer + 0.3 * torch.randn(rows, 7, generator=gen)
        mask = (torch.rand(rows, 7, generator=gen) > 0.3).float() * (0.0 if masked_out else 1.0)
        entropy = torch.rand(rows, 7, generator=gen)
        parts.append(mismatch_sums(trainer, sampler, mask, (0.2, 0.28), entropy))
        whole.append((trainer, sampler, mask, entropy))
    expected = _old_mismatch(*(torch.cat([w[i].flatten() for w in whole]) for i in range(4)), clip=(0.2, 0.28))
    assert MismatchSums.total(parts).metrics() == pytest.approx(expected, rel=1e-12)


def test_the_losss_statistics_are_device_tensors_read_once_per_pass() -> None:
    """A loss call gives 0-dim tensors (no read); `loss_metrics` reads a pass's worth; nothing scored: ratio max 1."""
    loss = GRPOLoss()
    new = torch.tensor([[-1.0, -0.5], [-0.2, -0.3]], requires_grad=True)
    old = torch.tensor([[-1.2, -0.5], [-0.2, -0.9]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    _, stats = loss(new, old, torch.tensor([1.0, -1.0]), mask, 2.0)
    _, empty = loss(new, old, torch.tensor([1.0, -1.0]), torch.zeros_like(mask), 2.0)
    assert isinstance(stats.tokens, torch.Tensor) and stats.tokens.dim() == 0
    assert float(empty.ratio_max) == 1.0
    metrics = loss_metrics([stats, empty])
    assert metrics["train/tokens"] == 3.0 and metrics["train/ratio_max"] == pytest.approx(1.0)
