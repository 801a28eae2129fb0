"""KDE buckets: valleys found where they are, group sizes by hand, EMA by hand, state round trip (the real run:
tests/integration/curriculum/test_kde_buckets.py)."""

import json

import numpy as np
import pytest

from grpo_pipe.curriculum.buckets import fit_buckets, rollouts_for
from grpo_pipe.curriculum.kde_buckets import KdeBucketCurriculum
from grpo_pipe.runner.pipeline import build
from grpo_pipe.types import Task

MODES = (0.1, 0.5, 0.9)


def _trimodal(per_mode: int = 300, spread: float = 0.05) -> np.ndarray:
    rng = np.random.default_rng(0)
    return np.concatenate([rng.normal(mode, spread, per_mode) for mode in MODES])  # [3 × per_mode]


def _tasks(count: int) -> list[Task]:
    return [Task(uid=f"t/{i}", question=f"q{i}", answer=str(i)) for i in range(count)]


def _reward_of(uid: str) -> float:
    """Three kinds of task: every third one is hard (0), medium (0.5) or easy (1)."""
    return MODES[int(uid.split("/")[1]) % 3] - 0.1


def _run_steps(curriculum: KdeBucketCurriculum, steps: int) -> list[list[tuple[Task, int]]]:
    batches = []
    for _ in range(steps):
        batch = curriculum.next_batch()
        uids = [task.uid for task, n in batch for _ in range(n)]
        curriculum.update(uids, [_reward_of(uid) for uid in uids])
        batches.append(batch)
    return batches


def test_trimodal_rewards_give_two_valleys_and_three_buckets_between_the_modes() -> None:
    fit = fit_buckets(_trimodal(), max_buckets=4, base=4, alpha=1.5)
    assert len(fit.boundaries) == 2 and [b.label for b in fit.buckets] == ["hard", "medium", "easy"]
    low, high = fit.boundaries
    assert MODES[0] + 0.15 < low < MODES[1] - 0.15 and MODES[1] + 0.15 < high < MODES[2] - 0.15
    assert [b.count for b in fit.buckets] == [300, 300, 300]  # 4 spreads apart: no sample crosses a valley
    assert sum(fit.density) > 0 and len(fit.grid) == len(fit.density)


def test_rollouts_follow_the_formula_and_are_monotone_in_difficulty() -> None:
    # base × (1 + α·(1 − m)) with base 4, α 1.5: m = 0 -> 10, m = 0.5 -> 7, m = 1 -> 4.
    assert [rollouts_for(m, 4, 1.5) for m in (0.0, 0.5, 1.0)] == [10, 7, 4]
    assert rollouts_for(1.0, 1, 0.0) == 2  # never below a GRPO group of 2
    fit = fit_buckets(_trimodal(), max_buckets=4, base=4, alpha=1.5)
    for bucket in fit.buckets:
        assert bucket.rollouts == round(4 * (1 + 1.5 * (1 - bucket.normalised_mean)))
    rollouts = [b.rollouts for b in fit.buckets]  # hardest first
    assert rollouts == sorted(rollouts, reverse=True) and rollouts[0] > rollouts[-1]


def test_unimodal_rewards_give_one_bucket() -> None:
    fit = fit_buckets(np.random.default_rng(1).normal(0.5, 0.1, 900), max_buckets=4, base=4, alpha=1.5)
    assert fit.boundaries == [] and len(fit.buckets) == 1 and fit.buckets[0].count == 900


def test_n_buckets_keeps_the_deepest_valleys_only() -> None:
    assert len(fit_buckets(_trimodal(), max_buckets=2, base=4, alpha=1.5).buckets) == 2


def test_equal_rewards_are_middle_difficulty() -> None:
    fit = fit_buckets([1.0] * 10, max_buckets=4, base=4, alpha=1.5)
    assert len(fit.buckets) == 1 and fit.buckets[0].rollouts == 7


def test_ema_by_hand() -> None:
    curriculum = KdeBucketCurriculum(ema_decay=0.7)
    curriculum.attach(_tasks(4))
    curriculum.update(["t/0", "t/0"], [1.0, 1.0])  # first observation: the step mean itself
    curriculum.update(["t/0", "t/0", "t/1"], [0.0, 0.5, 1.0])
    assert curriculum.ema == pytest.approx({"t/0": 0.7 * 1.0 + 0.3 * 0.25, "t/1": 1.0})


def test_refit_gives_harder_tasks_more_samples_and_one_report_per_refit(tmp_path) -> None:
    curriculum = KdeBucketCurriculum(prompts_per_step=6, samples_per_prompt=4, alpha=1.5, refit_every=None)
    curriculum.attach(_tasks(30))
    first = _run_steps(curriculum, 5)  # one pass over the 30 tasks: the default refit period
    assert {n for batch in first for _, n in batch} == {7}  # before any fit: middle difficulty for all
    assert curriculum.epoch == 1 and len(curriculum.buckets) == 3
    samples = {task.uid: n for batch in _run_steps(curriculum, 5) for task, n in batch}
    by_kind = {kind: {samples[f"t/{i}"] for i in range(kind, 30, 3)} for kind in range(3)}
    assert by_kind == {0: {10}, 1: {7}, 2: {4}}  # hard, medium, easy
    files = curriculum.take_reports(tmp_path)
    assert sorted(p.name for p in files) == [f"epoch_00{e}.{s}" for e in (1, 2) for s in ("json", "png", "txt")]
    report = json.loads((tmp_path / "epoch_001.json").read_text())
    assert [b["count"] for b in report["buckets"]] == [10, 10, 10] and len(report["boundaries"]) == 2
    assert "hard" in (tmp_path / "epoch_001.txt").read_text()
    assert (tmp_path / "epoch_001.png").read_bytes()[:4] == b"\x89PNG"
    assert curriculum.take_reports(tmp_path) == []  # nothing new since


def test_state_round_trips_ema_and_buckets() -> None:
    curriculum = KdeBucketCurriculum(prompts_per_step=6, refit_every=12, seed=3)
    curriculum.attach(_tasks(30))
    _run_steps(curriculum, 3)
    state = json.loads(json.dumps(curriculum.state_dict()))  # a checkpoint holds plain JSON
    resumed = KdeBucketCurriculum(prompts_per_step=6, refit_every=12, seed=3)
    resumed.attach(_tasks(30))
    resumed.load_state_dict(state)
    assert resumed.ema == curriculum.ema and resumed.buckets == curriculum.buckets and resumed.buckets
    assert _run_steps(resumed, 4) == _run_steps(curriculum, 4)
    assert resumed.state_dict() == curriculum.state_dict()


def test_yaml_defaults_build_the_curriculum(compose_cfg) -> None:
    curriculum = build(compose_cfg(["curriculum=kde_buckets"])).curriculum
    assert isinstance(curriculum, KdeBucketCurriculum)
    assert (curriculum.samples_per_prompt, curriculum.alpha, curriculum.ema_decay) == (4, 1.5, 0.7)
    assert curriculum.refit_every is None and curriculum.bandwidth == "scott"


def test_bad_settings_are_named() -> None:
    assert KdeBucketCurriculum(ema_decay=1.0).config_problems() == ["curriculum.ema_decay=1.0 must be in [0, 1)"]
