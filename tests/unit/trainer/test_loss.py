"""The loss family against an independent reference written here in plain Python (floats, loops,
`statistics`), and against numbers worked out by hand."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from grpo_pipe.trainer.loss import GRPOLoss, group_advantages

# ---- the reference: one completion at a time, no tensors ------------------------------------------------


def ref_advantages(rewards: list[float], groups: list[int], normalize_std: bool) -> list[float]:
    out = []
    for reward, group in zip(rewards, groups):
        members = [r for r, g in zip(rewards, groups) if g == group]
        if len(set(members)) == 1:
            out.append(0.0)
            continue
        centred = reward - statistics.fmean(members)
        out.append(centred / (statistics.stdev(members) + 1e-4) if normalize_std else centred)
    return out


def ref_loss(new, old, adv, lengths, *, aggregation, clip_low, clip_high, kl_coef=0.0, ref=None, budget=None,
             truncated=None, mask_truncated=False, proximal=None, is_cap=None, ratio_level="token",
             objective="clipped", cispo_max=5.0) -> float:
    """new/old/ref/proximal: [B][T] lists; lengths: [B]. The loss of the whole batch.

    `proximal` given: the ratio is taken against it and each token weighted by min(exp(proximal - old), is_cap)
    (ratio_reference=policy); else against `old`, the sampler's log-probs (ratio_reference=sampler).
    ratio_level="sequence" (GSPO): every token of a completion has its completion's ratio, exp of the mean log-ratio.
    objective="cispo": a token's loss is -weight x min(ratio, cispo_max) x advantage x its log-prob."""
    per_sequence, counted = [], []
    for i, length in enumerate(lengths):
        if mask_truncated and truncated[i]:
            continue
        bases = [old[i][t] if proximal is None else proximal[i][t] for t in range(length)]
        sequence_ratio = math.exp(statistics.fmean(new[i][t] - bases[t] for t in range(length)))
        tokens = []
        for t in range(length):
            weight = 1.0
            if proximal is not None and is_cap is not None:
                weight = min(math.exp(proximal[i][t] - old[i][t]), is_cap)
            ratio = sequence_ratio if ratio_level == "sequence" else math.exp(new[i][t] - bases[t])
            clipped = min(max(ratio, 1 - clip_low), 1 + clip_high)
            if objective == "cispo":
                value = -weight * min(ratio, cispo_max) * adv[i] * new[i][t]
            else:
                value = -weight * min(ratio * adv[i], clipped * adv[i])
            if kl_coef:
                d = ref[i][t] - new[i][t]
                value += kl_coef * (math.exp(d) - d - 1)
            tokens.append(value)
        per_sequence.append(tokens)
        counted.append(length)
    if aggregation == "sequence_mean":
        return sum(sum(s) / max(len(s), 1) for s in per_sequence) / len(per_sequence)
    if aggregation == "constant":
        return sum(sum(s) for s in per_sequence) / (len(per_sequence) * budget)
    return sum(sum(s) for s in per_sequence) / sum(counted)


def _batch(seed: int, batch: int = 5, width: int = 7):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, width + 1, (batch,), generator=gen).tolist()
    new = (torch.randn(batch, width, generator=gen, dtype=torch.float64) * 0.3 - 2)
    old = new + torch.randn(batch, width, generator=gen, dtype=torch.float64) * 0.3
    ref = new + torch.randn(batch, width, generator=gen, dtype=torch.float64) * 0.2
    adv = torch.randn(batch, generator=gen, dtype=torch.float64)
    mask = torch.zeros(batch, width, dtype=torch.float64)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    truncated = [bool(i % 2) for i in range(batch)]
    return new, old, ref, adv, mask, lengths, truncated


# ---- advantages -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("normalize_std", [True, False])
def test_equal_rewards_give_exactly_zero_advantage_in_any_dtype(dtype, normalize_std) -> None:
    for size in range(2, 17):
        for value in (0.7, -0.2, 0.1, 1 / 3):
            rewards = torch.full((size,), value, dtype=dtype)
            adv = group_advantages(rewards, torch.zeros(size, dtype=torch.long), normalize_std)
            assert torch.count_nonzero(adv) == 0, (dtype, size, value, adv.tolist())


def test_advantages_match_the_reference_with_mixed_groups() -> None:
    gen = torch.Generator().manual_seed(1)
    rewards = torch.randn(24, generator=gen, dtype=torch.float64)
    rewards[16:] = 0.7  # one flat group
    groups = torch.arange(24) // 8
    for normalize_std in (True, False):
        got = group_advantages(rewards, groups, normalize_std).tolist()
        want = ref_advantages(rewards.tolist(), groups.tolist(), normalize_std)
        assert got == pytest.approx(want, abs=1e-12)
        assert got[16:] == [0.0] * 8


def test_group_advantages_by_hand_use_the_sample_std() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1])
    assert group_advantages(rewards, groups, normalize_std=False).tolist() == [0.5, -0.5, -0.5, 0.5, 0.0, 0.0]
    a = 0.5 / (math.sqrt(1 / 3) + 1e-4)  # sample std of [.5, -.5, -.5, .5] = sqrt(1/3)
    assert group_advantages(rewards, groups, normalize_std=True)[:4].tolist() == pytest.approx([a, -a, -a, a])


# ---- the loss family --------------------------------------------------------------------------------------

VARIANTS = {  # the presets of conf/loss/*.yaml
    "grpo": {"aggregation": "sequence_mean"},
    "dr_grpo": {"aggregation": "constant", "max_tokens": 16},
    "dapo": {"aggregation": "token_mean", "mask_truncated": True},
    "gspo": {"aggregation": "sequence_mean", "ratio_level": "sequence"},  # its clip range: checked below
    "cispo": {"aggregation": "token_mean", "objective": "cispo", "cispo_max": 5.0},
}


RATIO_REFERENCES = {  # ratio_reference, is_cap
    "sampler": ("sampler", None),
    "policy, truncated IS": ("policy", 1.3),  # a low cap, so that some tokens of the random batch hit it
    "policy, no IS": ("policy", None),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("kl_coef", [0.0, 0.05])
@pytest.mark.parametrize("reference", sorted(RATIO_REFERENCES))
def test_every_variant_matches_the_reference(variant: str, kl_coef: float, reference: str) -> None:
    settings = VARIANTS[variant]
    ratio_reference, is_cap = RATIO_REFERENCES[reference]
    loss_fn = GRPOLoss(clip_low=0.2, clip_high=0.28, kl_coef=kl_coef, ratio_reference=ratio_reference, is_cap=is_cap,
                       **settings)
    for seed in range(3):
        new, old, ref, adv, mask, lengths, truncated = _batch(seed)
        # A later optimizer pass: the proximal policy (the batch's first pass) differs from the current one.
        proximal = new + torch.randn(new.shape, generator=torch.Generator().manual_seed(seed), dtype=new.dtype) * 0.2
        if loss_fn.mask_truncated:
            mask = mask * torch.tensor([[0.0] if t else [1.0] for t in truncated], dtype=mask.dtype)
        counted = [n for n, t in zip(lengths, truncated) if not (loss_fn.mask_truncated and t)]
        got, _ = loss_fn(new, old, adv, mask, loss_fn.normaliser(counted), ref_logprobs=ref if kl_coef else None,
                         proximal_logprobs=proximal)
        want = ref_loss(new.tolist(), old.tolist(), adv.tolist(), lengths, aggregation=settings["aggregation"],
                        clip_low=0.2, clip_high=0.28, kl_coef=kl_coef, ref=ref.tolist(), budget=settings.get("max_tokens"),
                        truncated=truncated, mask_truncated=loss_fn.mask_truncated,
                        proximal=None if ratio_reference == "sampler" else proximal.tolist(), is_cap=is_cap,
                        ratio_level=settings.get("ratio_level", "token"), objective=settings.get("objective", "clipped"),
                        cispo_max=settings.get("cispo_max", 5.0))
        assert float(got) == pytest.approx(want, rel=1e-12, abs=1e-12)


# The flat settings above as conf/loss/*.yaml spell them: the objective is a class of its own.
OBJECTIVES = {"ratio_level": {"sequence": "SequenceRatio"}, "objective": {"cispo": "ClippedWeights"}}


def test_conf_presets_are_the_variants_tested_here(compose_cfg) -> None:
    for name, settings in VARIANTS.items():
        cfg = compose_cfg([f"loss={name}", "run.max_new_tokens=16"])
        for key, value in settings.items():
            if key in OBJECTIVES:
                assert cfg.loss.objective._target_.endswith("." + OBJECTIVES[key][value]), (name, key)
            elif key == "cispo_max":
                assert cfg.loss.objective.max_weight == value, name
            else:
                assert cfg.loss[key] == value, (name, key)
    gspo = compose_cfg(["loss=gspo"]).loss.objective
    assert (gspo.clip_low, gspo.clip_high) == (3e-4, 4e-4)  # the GSPO paper's (and TRL's documented) range
    assert compose_cfg(["loss=bnpo"]).loss.aggregation == "micro_batch_token_mean"  # its own test: micro-batches


def test_gspo_clips_a_completion_as_a_whole() -> None:
    # Two tokens whose log-ratios are +0.5 and -0.5: each alone is far outside the clip, their mean (0) is inside.
    new = torch.tensor([[0.5, -0.5]], dtype=torch.float64, requires_grad=True)
    proximal = torch.zeros(1, 2, dtype=torch.float64)
    mask, adv = torch.ones(1, 2, dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64)
    gspo = GRPOLoss(ratio_level="sequence", clip_low=3e-4, clip_high=4e-4, is_cap=None)
    loss, stats = gspo(new, proximal, adv, mask, gspo.normaliser([2]), proximal_logprobs=proximal)
    loss.backward()
    assert float(loss) == pytest.approx(-1.0) and stats.clipped_tokens == 0
    assert new.grad is not None and new.grad[0].tolist() == pytest.approx([-0.5, -0.5])  # d/dnew of -exp(mean)


def test_cispo_keeps_every_tokens_gradient_with_a_capped_weight() -> None:
    # A token whose ratio (e^2 = 7.4) passes cispo_max=5: PPO's clip would zero its gradient, CISPO weighs it by 5.
    new = torch.tensor([[-1.0, -2.0]], dtype=torch.float64, requires_grad=True)
    proximal = torch.tensor([[-3.0, -2.0]], dtype=torch.float64)
    mask, adv = torch.ones(1, 2, dtype=torch.float64), torch.tensor([0.5], dtype=torch.float64)
    cispo = GRPOLoss(objective="cispo", cispo_max=5.0, aggregation="token_mean", is_cap=None)
    loss, stats = cispo(new, proximal, adv, mask, cispo.normaliser([2]), proximal_logprobs=proximal)
    loss.backward()
    assert float(loss) == pytest.approx(-(5.0 * 0.5 * -1.0 + 1.0 * 0.5 * -2.0) / 2)
    assert new.grad is not None and new.grad[0].tolist() == pytest.approx([-5.0 * 0.5 / 2, -1.0 * 0.5 / 2])
    assert stats.clipped_tokens == 1 and stats.clipped_positive == 1  # the capped weight is counted, as TRL does


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_micro_batch_losses_sum_to_the_full_batch_loss(variant: str) -> None:
    loss_fn = GRPOLoss(kl_coef=0.1, **VARIANTS[variant])
    new, old, ref, adv, mask, lengths, _ = _batch(7)
    norm = loss_fn.normaliser(lengths)
    full, _ = loss_fn(new, old, adv, mask, norm, ref_logprobs=ref)
    parts = sum(float(loss_fn(new[i : i + 2], old[i : i + 2], adv[i : i + 2], mask[i : i + 2], norm,
                              ref_logprobs=ref[i : i + 2])[0]) for i in range(0, len(lengths), 2))
    assert parts == pytest.approx(float(full), rel=1e-12)


def test_dr_grpo_normaliser_is_the_budget_not_the_longest_completion() -> None:
    loss_fn = GRPOLoss(**VARIANTS["dr_grpo"])
    assert loss_fn.normaliser([3, 5]) == 2 * 16 and loss_fn.normaliser([1, 2]) == 2 * 16
    # the same token losses give the same loss whatever else the step's longest completion was
    one = torch.zeros(1, 2, dtype=torch.float64)
    short = loss_fn(one, one, torch.ones(1, dtype=torch.float64), torch.ones(1, 2), loss_fn.normaliser([2, 9]))[0]
    long = loss_fn(one, one, torch.ones(1, dtype=torch.float64), torch.ones(1, 2), loss_fn.normaliser([2, 15]))[0]
    assert float(short) == float(long) == -2 / 32


def test_token_mean_weighs_every_token_alike_and_sequence_mean_every_completion() -> None:
    new = torch.zeros(2, 3)
    mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    adv = torch.tensor([1.0, -1.0])
    token = GRPOLoss(aggregation="token_mean")
    sequence = GRPOLoss(aggregation="sequence_mean")
    assert float(token(new, new, adv, mask, token.normaliser([1, 3]))[0]) == pytest.approx((-1 + 3) / 4)
    assert float(sequence(new, new, adv, mask, sequence.normaliser([1, 3]))[0]) == pytest.approx((-1 + 1) / 2)


def test_clipped_surrogate_by_hand() -> None:
    new = torch.log(torch.tensor([[0.5, 0.25]]))
    old = torch.log(torch.tensor([[0.5, 0.5]]))  # ratios [1.0, 0.5]
    loss_fn = GRPOLoss(clip_low=0.2, clip_high=0.2, ratio_reference="sampler", is_cap=None)
    # adv=+1: token1 -> -1; token2: min(0.5, clip(0.5)=0.8) = 0.5 -> -0.5; mean = -0.75
    assert float(loss_fn(new, old, torch.tensor([1.0]), torch.ones(1, 2), 1.0)[0]) == pytest.approx(-0.75)
    # adv=-1: token2: min(-0.5, -0.8) = -0.8 -> +0.8 (pessimistic: the clip binds); mean = 0.9
    assert float(loss_fn(new, old, torch.tensor([-1.0]), torch.ones(1, 2), 1.0)[0]) == pytest.approx(0.9)


def test_k3_kl_by_hand_is_zero_at_the_reference_and_positive_away_from_it() -> None:
    loss_fn = GRPOLoss(kl_coef=1.0)
    new = torch.log(torch.tensor([[0.5]]))
    zero_adv = torch.zeros(1)
    at_ref, stats = loss_fn(new, new, zero_adv, torch.ones(1, 1), 1.0, ref_logprobs=new)
    assert float(at_ref) == 0.0 and stats.kl_sum == 0.0
    ref = torch.log(torch.tensor([[0.25]]))  # d = log(0.5): k3 = 0.5 - log 0.5 - 1
    away, _ = loss_fn(new, new, zero_adv, torch.ones(1, 1), 1.0, ref_logprobs=ref)
    assert float(away) == pytest.approx(0.5 - math.log(0.5) - 1)


def _stale_token(is_cap: float | None) -> tuple[float, float]:
    """One token the trainer now gives p=0.5 that the (stale) sampler drew with p=0.25; advantage 1."""
    new = torch.log(torch.tensor([[0.5]])).requires_grad_(True)
    old = torch.log(torch.tensor([[0.25]]))
    reference = "sampler" if is_cap is None else "policy"
    loss_fn = GRPOLoss(clip_low=0.2, clip_high=0.28, ratio_reference=reference, is_cap=is_cap)
    loss, _ = loss_fn(new, old, torch.tensor([1.0]), torch.ones(1, 1), 1.0)
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


def test_the_first_pass_against_the_policy_has_ratio_one_and_clips_nothing() -> None:
    """With ratio_reference=policy, a sampler that disagrees with the trainer (numerics, a lagging engine) takes no
    gradient away on the first pass: the clip sees ratio 1, and the IS weight alone carries the difference."""
    new = torch.log(torch.tensor([[0.5, 0.1, 0.9]])).requires_grad_(True)
    sampler = torch.log(torch.tensor([[0.25, 0.3, 0.9]]))  # trainer/sampler ratios 2, 1/3, 1
    loss_fn = GRPOLoss(clip_low=0.2, clip_high=0.28, is_cap=1.5)
    loss, stats = loss_fn(new, sampler, torch.tensor([1.0]), torch.ones(1, 3), 1.0)
    loss.backward()
    assert stats.clipped_tokens == 0 and stats.ratio_max == 1.0
    assert stats.is_truncated == 1  # the ratio 2 was cut to 1.5
    assert new.grad.tolist()[0] == pytest.approx([-1.5 / 3, -1 / 9, -1 / 3])  # weights 1.5, 1/3, 1 over 3 tokens
    assert stats.is_weight_sum == pytest.approx(1.5 + 1 / 3 + 1)


def test_clip_fraction_is_counted_by_the_sign_of_the_advantage() -> None:
    new = torch.log(torch.tensor([[0.5, 0.5], [0.5, 0.5]]))
    sampler = torch.log(torch.tensor([[0.25, 0.5], [0.25, 0.5]]))  # ratio 2 on each first token
    loss_fn = GRPOLoss(ratio_reference="sampler", is_cap=None)
    _, stats = loss_fn(new, sampler, torch.tensor([1.0, -1.0]), torch.ones(2, 2), 1.0)
    # adv > 0: ratio 2 > 1.28 is clipped; adv < 0: the unclipped term is the pessimistic one, nothing clipped
    assert (stats.positive_tokens, stats.clipped_positive) == (2, 1)
    assert (stats.negative_tokens, stats.clipped_negative) == (2, 0)


def test_bad_settings_are_all_named() -> None:
    problems = GRPOLoss(aggregation="constant", max_tokens=None, kl_coef=-1.0, ratio_reference="sampler",
                        is_cap=2.0).config_problems()
    message = "\n".join(problems)
    assert "loss.kl_coef=-1.0" in message and "loss.max_tokens=None" in message
    assert "loss.correction (CappedRatio) with loss.ratio_reference=sampler" in message


def test_entropy_bonus_by_hand_lowers_each_tokens_loss_by_coef_times_its_entropy() -> None:
    new = torch.log(torch.tensor([[0.5, 0.25, 0.9]]))
    entropy = torch.tensor([[0.7, 1.2, 5.0]], requires_grad=True)  # the third position is padding
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss_fn = GRPOLoss(aggregation="token_mean", entropy_coef=0.1)
    plain = GRPOLoss(aggregation="token_mean")
    adv = torch.tensor([0.5])
    with_bonus, _ = loss_fn(new, new, adv, mask, 2.0, entropy=entropy)
    without, _ = plain(new, new, adv, mask, 2.0)
    assert float(with_bonus) == pytest.approx(float(without) - 0.1 * (0.7 + 1.2) / 2)
    with_bonus.backward()
    assert entropy.grad is not None and entropy.grad.tolist() == [[pytest.approx(-0.05), pytest.approx(-0.05), 0.0]]
    assert loss_fn.needs_every_sample and not plain.needs_every_sample
    with pytest.raises(ValueError, match="no entropy was given"):
        loss_fn(new, new, adv, mask, 2.0)
    assert GRPOLoss(entropy_coef=-0.1).config_problems() == [
        "loss.entropy_coef=-0.1: must be >= 0 (0: no entropy bonus)"]


def test_entropy_floor_gives_the_bonus_only_to_completions_below_it() -> None:
    new = torch.zeros(2, 2)
    entropy = torch.tensor([[0.1, 0.2], [0.9, 1.5]], requires_grad=True)  # means 0.15 (collapsed) and 1.2 (spread)
    mask = torch.ones(2, 2)
    loss_fn = GRPOLoss(aggregation="token_mean", entropy_coef=0.5, entropy_floor=0.3)
    loss, _ = loss_fn(new, new, torch.zeros(2), mask, 4.0, entropy=entropy)
    assert float(loss) == pytest.approx(-0.5 * (0.1 + 0.2) / 4)
    loss.backward()
    assert entropy.grad is not None and entropy.grad.tolist() == [[-0.125, -0.125], [0.0, 0.0]]
    assert GRPOLoss(entropy_floor=0.0).config_problems()[0].startswith("loss.entropy_floor=0.0: must be > 0")


def test_bnpo_averages_each_micro_batchs_token_mean_over_the_steps_micro_batches() -> None:
    """TRL's loss_type="bnpo": (sum of a micro-batch's token losses / its tokens) / gradient-accumulation steps."""
    loss_fn = GRPOLoss(aggregation="micro_batch_token_mean", is_cap=None)
    norm = loss_fn.normaliser([2, 1, 3], micro_batches=2)
    assert norm == 2.0 and loss_fn.needs_every_sample  # zero-advantage tokens count in their micro-batch
    zeros = torch.zeros(2, 2)
    first = loss_fn(zeros, zeros, torch.tensor([1.0, -1.0]), torch.tensor([[1.0, 1.0], [1.0, 0.0]]), norm)[0]
    second = loss_fn(torch.zeros(1, 3), torch.zeros(1, 3), torch.tensor([2.0]), torch.ones(1, 3), norm)[0]
    # micro-batch 1: token losses -1, -1, +1 over 3 tokens; micro-batch 2: -2 x 3 over 3 tokens; mean of the two
    assert float(first) + float(second) == pytest.approx(((-1 - 1 + 1) / 3 + (-2 * 3) / 3) / 2)


@pytest.mark.parametrize("reference", sorted(RATIO_REFERENCES))
def test_bnpo_matches_the_reference_micro_batch_by_micro_batch(reference: str) -> None:
    """The reference: each micro-batch's plain-Python token mean (`ref_loss`), then their mean, as TRL computes bnpo."""
    ratio_reference, is_cap = RATIO_REFERENCES[reference]
    loss_fn = GRPOLoss(aggregation="micro_batch_token_mean", ratio_reference=ratio_reference, is_cap=is_cap, kl_coef=0.05)
    for seed in range(3):
        new, old, ref, adv, mask, lengths, _ = _batch(seed)
        proximal = new + torch.randn(new.shape, generator=torch.Generator().manual_seed(seed), dtype=new.dtype) * 0.2
        parts = [range(0, 2), range(2, 4), range(4, 5)]
        norm = loss_fn.normaliser(lengths, micro_batches=len(parts))
        got = sum(float(loss_fn(new[p.start:p.stop], old[p.start:p.stop], adv[p.start:p.stop], mask[p.start:p.stop], norm,
                                ref_logprobs=ref[p.start:p.stop], proximal_logprobs=proximal[p.start:p.stop])[0])
                  for p in parts)
        want = statistics.fmean(
            ref_loss(new[p.start:p.stop].tolist(), old[p.start:p.stop].tolist(), adv[p.start:p.stop].tolist(),
                     lengths[p.start:p.stop], aggregation="token_mean", clip_low=0.2, clip_high=0.28, kl_coef=0.05,
                     ref=ref[p.start:p.stop].tolist(),
                     proximal=None if ratio_reference == "sampler" else proximal[p.start:p.stop].tolist(), is_cap=is_cap)
            for p in parts)
        assert got == pytest.approx(want, rel=1e-12, abs=1e-12)
