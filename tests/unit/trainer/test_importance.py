"""The sampling corrections (`loss/correction=`) against weights worked out by hand, and their effect on the loss."""

from __future__ import annotations

import math

import pytest
import torch

from grpo_pipe.interfaces import SamplingCorrection
from grpo_pipe.runner.components import build
from grpo_pipe.trainer.importance import CappedRatio, IcePop
from grpo_pipe.trainer.loss import ClippedSurrogate, PolicyGradientLoss
from tests.conftest import CONF

# Two completions; pi_trainer / pi_engine per token: [3, 0.5, 1] and [1.5, 1.5, (padding: 10)].
RATIOS = [[3.0, 0.5, 1.0], [1.5, 1.5, 10.0]]
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=torch.float64)  # [B, T]
SAMPLER = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -0.7, -3.0]], dtype=torch.float64)  # [B, T]
TRAINER = SAMPLER + torch.tensor([[math.log(r) for r in row] for row in RATIOS], dtype=torch.float64)  # [B, T]
# Each completion's likelihood ratio over its own tokens: 3 x 0.5 x 1 = 1.5 and 1.5 x 1.5 = 2.25 (padding left out).

CASES = {
    "token_truncate": (CappedRatio(cap=2.0), [[2.0, 0.5, 1.0], [1.5, 1.5, 2.0]],
                       [[True, False, False], [False, False, True]]),
    "token_mask": (CappedRatio(masks=True, cap=2.0), [[0.0, 0.5, 1.0], [1.5, 1.5, 0.0]],
                   [[True, False, False], [False, False, True]]),
    "sequence_truncate": (CappedRatio(per_sequence=True, cap=2.0), [[1.5, 1.5, 1.5], [2.0, 2.0, 2.0]],
                          [[False, False, False], [True, True, True]]),
    "sequence_mask": (CappedRatio(per_sequence=True, masks=True, cap=2.0), [[1.5, 1.5, 1.5], [0.0, 0.0, 0.0]],
                      [[False, False, False], [True, True, True]]),
    "icepop": (IcePop(low=0.6, high=2.0), [[0.0, 0.0, 1.0], [1.5, 1.5, 0.0]], [[True, True, False], [False, False, True]]),
}


@pytest.mark.parametrize("mode", sorted(CASES))
def test_each_mode_weighs_tokens_as_worked_out_by_hand(mode: str) -> None:
    correction, want, corrected = CASES[mode]
    assert isinstance(correction, SamplingCorrection)
    weight, touched = correction.weights(TRAINER, SAMPLER, MASK)
    assert weight.tolist() == [pytest.approx(row, abs=1e-12) for row in want]
    assert touched.tolist() == corrected


@pytest.mark.parametrize("mode", sorted(CASES))
def test_the_loss_multiplies_each_tokens_term_by_the_weight(mode: str) -> None:
    # First pass: the ratio is 1, so each token's surrogate is -weight x advantage, its gradient -weight x advantage.
    correction, want, corrected = CASES[mode]
    loss_fn = PolicyGradientLoss(objective=ClippedSurrogate(), correction=correction, aggregation="token_mean")
    new = TRAINER.clone().requires_grad_(True)
    adv = torch.tensor([1.0, -2.0], dtype=torch.float64)
    loss, stats = loss_fn(new, SAMPLER, adv, MASK, loss_fn.normaliser([3, 2]))
    loss.backward()
    w = want
    by_hand = -(w[0][0] + w[0][1] + w[0][2]) * 1.0 + (w[1][0] + w[1][1]) * 2.0  # summed over the 5 model tokens
    assert float(loss.detach()) == pytest.approx(by_hand / 5, abs=1e-12)
    assert new.grad is not None
    assert new.grad.tolist() == [pytest.approx([-w[0][t] / 5 for t in range(3)], abs=1e-12),
                                 pytest.approx([2 * w[1][0] / 5, 2 * w[1][1] / 5, 0.0], abs=1e-12)]
    assert stats.is_truncated == sum(c for row, m in zip(corrected, MASK.tolist()) for c, on in zip(row, m) if on)
    assert stats.is_weight_sum == pytest.approx(w[0][0] + w[0][1] + w[0][2] + w[1][0] + w[1][1], abs=1e-12)


def test_no_correction_weighs_every_token_one() -> None:
    loss_fn = PolicyGradientLoss(objective=ClippedSurrogate(), correction=None, aggregation="token_mean")
    loss, stats = loss_fn(TRAINER, SAMPLER, torch.tensor([1.0, -2.0], dtype=torch.float64), MASK, 5.0)
    assert float(loss) == pytest.approx((-3.0 + 4.0) / 5, abs=1e-12)
    assert (stats.is_weight_sum, stats.is_truncated) == (5.0, 0.0)


@pytest.mark.parametrize(("correction", "problem"), [
    (CappedRatio(cap=0.0), "loss.correction.cap=0.0: must be > 0"),
    (CappedRatio(masks=True, cap=-1.0), "loss.correction.cap=-1.0: must be > 0"),
    (CappedRatio(per_sequence=True, cap=0.0), "loss.correction.cap=0.0: must be > 0"),
    (CappedRatio(per_sequence=True, masks=True, cap=0.0), "loss.correction.cap=0.0: must be > 0"),
    (IcePop(low=0.0, high=2.0), "loss.correction.low=0.0: must be > 0"),
    (IcePop(low=2.0, high=1.0), "loss.correction.high=1.0: must be > loss.correction.low=2.0"),
])
def test_a_bad_setting_is_named_by_its_key(correction: SamplingCorrection, problem: str) -> None:
    loss_fn = PolicyGradientLoss(objective=ClippedSurrogate(), correction=correction)
    assert loss_fn.config_problems() == [problem]


OPTIONS = sorted(p.stem for p in (CONF / "loss" / "correction").glob("*.yaml"))


@pytest.mark.parametrize("option", OPTIONS)
def test_every_correction_option_builds_a_sampling_correction_inside_the_loss(compose_cfg, option: str) -> None:
    loss = build(compose_cfg([f"loss/correction={option}"])).trainer.loss
    assert isinstance(loss, PolicyGradientLoss) and isinstance(loss.correction, SamplingCorrection)
    assert set(OPTIONS) == set(CASES)  # each option is checked by hand above


def test_no_correction_is_a_setting_of_the_command_line(compose_cfg) -> None:
    loss = build(compose_cfg(["loss.ratio_reference=sampler", "loss.correction=null"])).trainer.loss
    assert isinstance(loss, PolicyGradientLoss) and loss.correction is None
