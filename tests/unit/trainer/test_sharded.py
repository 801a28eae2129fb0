"""The sharded trainer's step metrics, combined from its ranks' reports."""

import pytest

from grpo_pipe.trainer.sharded import combine

UPDATE = {"train/grad_norm": 0.5, "train/update_applied": 1.0, "train/skipped_updates_total": 0.0, "train/lr": 1e-5}


def test_a_rank_that_trained_only_padding_leaves_the_mismatch_to_the_ranks_that_saw_sampled_tokens() -> None:
    """Found on GPUs with two ranks: a rank whose share of a small batch was padding reports no engine mismatch
    (it saw no sampled token); the step's figures come from the rank that did, instead of a KeyError."""
    trained = {**UPDATE, "train/loss": 0.25, "train/tokens": 30.0, "train/clip_fraction": 0.2, "train/ratio_max": 1.3,
               "mismatch/logprob_abs_mean": 0.01, "mismatch/logprob_abs_max": 0.05, "mismatch/ratio_max": 1.1}
    padding = {**UPDATE, "train/loss": 0.0, "train/tokens": 0.0, "train/clip_fraction": 0.0, "train/ratio_max": 1.0}
    for ranks in ([trained, padding], [padding, trained]):
        step = combine(ranks)
        assert step["mismatch/logprob_abs_mean"] == pytest.approx(0.01)
        assert step["mismatch/logprob_abs_max"] == 0.05 and step["mismatch/ratio_max"] == 1.1
        assert step["train/clip_fraction"] == pytest.approx(0.2) and step["train/ratio_max"] == 1.3
        assert step["train/tokens"] == 30.0 and step["train/loss"] == 0.25 and step["train/grad_norm"] == 0.5


def test_figures_every_rank_reports_are_weighted_by_the_tokens_each_trained() -> None:
    ranks = [{**UPDATE, "train/loss": 0.1, "train/tokens": 10.0, "mismatch/logprob_abs_mean": 0.04, "train/kl": 0.0},
             {**UPDATE, "train/loss": 0.2, "train/tokens": 30.0, "mismatch/logprob_abs_mean": 0.02, "train/kl": 0.4}]
    step = combine(ranks)
    assert step["mismatch/logprob_abs_mean"] == pytest.approx((0.04 * 10 + 0.02 * 30) / 40)
    assert step["train/kl"] == pytest.approx(0.3) and step["train/loss"] == pytest.approx(0.3)


def test_memory_is_the_fullest_ranks_card() -> None:
    ranks = [{**UPDATE, "train/loss": 0.0, "train/tokens": 1.0, "memory/trainer_peak_gib": 60.0, "memory/device_used_gib": 70.0},
             {**UPDATE, "train/loss": 0.0, "train/tokens": 1.0, "memory/trainer_peak_gib": 61.5, "memory/device_used_gib": 69.0}]
    step = combine(ranks)
    assert step["memory/trainer_peak_gib"] == 61.5 and step["memory/device_used_gib"] == 70.0
    cpu_ranks = [{k: v for k, v in r.items() if not k.startswith("memory/")} for r in ranks]
    assert "memory/trainer_peak_gib" not in combine(cpu_ranks)  # ranks on CPUs report none
