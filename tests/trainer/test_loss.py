"""The loss against numbers worked out by hand."""

import math

import pytest
import torch

from grpo_pipe.trainer.loss import group_advantages, policy_loss


def test_group_advantages_by_hand() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1])
    centred = group_advantages(rewards, groups, normalize_std=False)
    assert centred.tolist() == [0.5, -0.5, -0.5, 0.5, 0.0, 0.0]
    scaled = group_advantages(rewards, groups, normalize_std=True)
    std = math.sqrt(1 / 3)  # unbiased std of [.5, -.5, -.5, .5]
    a = 0.5 / (std + 1e-4)
    assert scaled[:4].tolist() == pytest.approx([a, -a, -a, a])
    assert scaled[4:].tolist() == [0.0, 0.0]


def _loss(adv: float, aggregation: str, max_tokens: int = 2) -> float:
    new = torch.log(torch.tensor([[0.5, 0.25]]))
    old = torch.log(torch.tensor([[0.5, 0.5]]))  # ratios [1.0, 0.5]
    loss, stats = policy_loss(
        new, old, torch.tensor([adv]), torch.ones(1, 2),
        aggregation=aggregation, clip_low=0.2, clip_high=0.2, total_sequences=1, max_tokens=max_tokens,
    )
    return float(loss)


def test_clipped_surrogate_by_hand() -> None:
    # adv=+1: token1 -> -1; token2: min(0.5, clip(0.5)=0.8) = 0.5 -> -0.5; mean = -0.75
    assert _loss(1.0, "grpo") == pytest.approx(-0.75)
    # adv=-1: token2: min(-0.5, -0.8) = -0.8 -> +0.8 (pessimistic: the clip binds); mean = 0.9
    assert _loss(-1.0, "grpo") == pytest.approx(0.9)


def test_dr_grpo_divides_by_a_constant() -> None:
    # sum over tokens (-1.5) / (1 sequence * 4 max tokens)
    assert _loss(1.0, "dr_grpo", max_tokens=4) == pytest.approx(-0.375)


def test_grpo_averages_each_sequence_over_its_own_length() -> None:
    new = torch.zeros(2, 3)
    old = torch.zeros(2, 3)
    mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    loss, stats = policy_loss(
        new, old, torch.tensor([1.0, 1.0]), mask,
        aggregation="grpo", clip_low=0.2, clip_high=0.2, total_sequences=2, max_tokens=3,
    )
    assert float(loss) == pytest.approx(-1.0)  # each sequence contributes -1, averaged over 2
    assert stats.tokens == 4.0 and stats.clipped_tokens == 0.0


def test_micro_batch_losses_sum_to_the_full_batch_loss() -> None:
    torch.manual_seed(0)
    new, old = torch.randn(4, 5) - 2, torch.randn(4, 5) - 2
    adv = torch.randn(4)
    mask = (torch.rand(4, 5) > 0.3).float()
    kw = dict(aggregation="grpo", clip_low=0.2, clip_high=0.28, total_sequences=4, max_tokens=5)
    full, _ = policy_loss(new, old, adv, mask, **kw)
    parts = sum(float(policy_loss(new[i : i + 1], old[i : i + 1], adv[i : i + 1], mask[i : i + 1], **kw)[0]) for i in range(4))
    assert parts == pytest.approx(float(full), abs=1e-6)


def _stale_token(is_cap: float | None) -> tuple[float, float]:
    """One token the trainer now gives p=0.5 that the (stale) sampler drew with p=0.25; advantage 1."""
    new = torch.log(torch.tensor([[0.5]])).requires_grad_(True)
    old = torch.log(torch.tensor([[0.25]]))
    loss, _ = policy_loss(
        new, old, torch.tensor([1.0]), torch.ones(1, 1),
        aggregation="grpo", clip_low=0.2, clip_high=0.28, total_sequences=1, max_tokens=1, is_cap=is_cap,
    )
    loss.backward()
    return float(loss), float(new.grad)


def test_ratio_clipping_against_the_sampler_zeroes_the_gradient_of_a_stale_token() -> None:
    loss, grad = _stale_token(is_cap=None)
    assert loss == pytest.approx(-1.28)  # ratio 2 clipped to 1 + 0.28
    assert grad == 0.0  # clipped: the token teaches nothing


def test_truncated_importance_sampling_keeps_the_gradient_with_a_capped_weight() -> None:
    loss, grad = _stale_token(is_cap=1.5)
    assert loss == pytest.approx(-1.5)  # weight min(0.5 / 0.25, 1.5) x ratio-to-self 1 x advantage 1
    assert grad == pytest.approx(-1.5)  # d/dlogp of -1.5 * exp(logp - logp.detach())
    loss, grad = _stale_token(is_cap=4.0)
    assert (loss, grad) == (pytest.approx(-2.0), pytest.approx(-2.0))  # under the cap: the full weight 2
