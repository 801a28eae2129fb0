"""The length ladder: shortest tasks first, the next length when the longest sampled is passed, resumable."""

from pathlib import Path

import pytest

from grpo_pipe.config.errors import InputError
from grpo_pipe.curriculum.length_ladder import LengthLadderCurriculum
from grpo_pipe.data.arithmetic import ArithmeticTasks
from grpo_pipe.runner.data_checks import check_data_and_reward
from tests.fakes import fake_components

TASKS = ArithmeticTasks(terms=[2, 4], train_size=60, seed=0).train_tasks()  # operations 1, 2 and 3, 20 of each


def _ladder(**settings) -> LengthLadderCurriculum:
    ladder = LengthLadderCurriculum(**{"prompts_per_step": 4, "samples_per_prompt": 2, "min_prompts": 8,
                                       "advance_at": 0.5, "ema_decay": 0.5, **settings})
    ladder.attach(TASKS)
    return ladder


def _step(ladder: LengthLadderCurriculum, reward: float) -> tuple[list[int], dict[str, float]]:
    """One batch, every completion scored `reward`: the batch's operations and the update's metrics."""
    batch = ladder.next_batch()
    uids = [task.uid for task, samples in batch for _ in range(samples)]
    return [task.metadata["operations"] for task, _ in batch], ladder.update(uids, [reward] * len(uids))


def test_it_starts_on_the_shortest_tasks_and_climbs_only_when_they_are_passed_often_enough() -> None:
    ladder = _ladder()
    assert _step(ladder, 0.5)[0] == [1, 1, 1, 1]  # 0.5: the steps credit of a wrong answer, not a pass
    operations, metrics = _step(ladder, 1.5)  # 8 prompts of the level now; EMA 0.5·0 + 0.5·1 = 0.5 >= advance_at
    assert operations == [1, 1, 1, 1]
    assert metrics == {"curriculum/level": 2.0, "curriculum/unlocked": 2.0, "curriculum/pass_rate/operations_1": 0.5}
    assert _step(ladder, 0.0)[0] == [1, 2, 1, 2]  # the two unlocked lengths in turn


def test_a_level_needs_min_prompts_before_the_next_joins_and_the_top_level_ends_uniform() -> None:
    ladder = _ladder(min_prompts=12)
    for _ in range(2):
        assert _step(ladder, 1.0)[1]["curriculum/unlocked"] == 1.0  # passed, but only 4 then 8 prompts seen
    assert _step(ladder, 1.0)[1]["curriculum/unlocked"] == 2.0
    for _ in range(5):  # two prompts of the top level a step now: 12 after six steps
        assert _step(ladder, 1.0)[1]["curriculum/unlocked"] == 2.0
    metrics = _step(ladder, 1.0)[1]
    assert metrics["curriculum/unlocked"] == 3.0 and metrics["curriculum/level"] == 3.0
    counts = [0, 0, 0]
    for _ in range(3):
        for op in _step(ladder, 1.0)[0]:
            counts[op - 1] += 1
    assert counts == [4, 4, 4]  # every length unlocked: equal shares, as uniform sampling over lengths


def test_each_levels_tasks_come_in_shuffled_passes_of_their_own() -> None:
    ladder = _ladder(prompts_per_step=20)
    batch = ladder.next_batch()
    assert sorted(t.uid for t, _ in batch) == sorted(t.uid for t in TASKS if t.metadata["operations"] == 1)
    assert [t.uid for t, _ in batch] != [t.uid for t in TASKS if t.metadata["operations"] == 1]


def test_a_resumed_ladder_hands_out_exactly_what_the_uninterrupted_one_would() -> None:
    first = _ladder()
    for reward in (1.0, 1.0, 0.0):
        _step(first, reward)
    resumed = _ladder()
    resumed.load_state_dict(first.state_dict())
    for reward in (1.0, 0.0, 1.0, 1.0):
        a, b = first.next_batch(), resumed.next_batch()
        assert [t.uid for t, _ in a] == [t.uid for t, _ in b]
        uids = [t.uid for t, n in a for _ in range(n)]
        assert first.update(uids, [reward] * len(uids)) == resumed.update(uids, [reward] * len(uids))
    assert first.state_dict() == resumed.state_dict()


def test_bad_settings_are_named() -> None:
    ladder = LengthLadderCurriculum(prompts_per_step=0, samples_per_prompt=1, key="", advance_at=1.5, min_prompts=0,
                                    ema_decay=1.0)
    assert [p.split("=", 1)[0] for p in ladder.config_problems()] == [
        "curriculum.prompts_per_step", "curriculum.samples_per_prompt", "curriculum.key", "curriculum.advance_at",
        "curriculum.min_prompts", "curriculum.ema_decay"]
    assert LengthLadderCurriculum().config_problems() == []


def test_tasks_without_a_length_are_one_line_of_the_input_errors_before_anything_loads(tmp_path: Path) -> None:
    parts = fake_components(tmp_path)
    parts.curriculum = LengthLadderCurriculum()
    train = list(parts.data.train_tasks())
    with pytest.raises(InputError) as err:
        check_data_and_reward(parts, train, list(parts.data.eval_tasks()))
    assert err.value.problems == [
        f"curriculum.key='operations': {len(train)} of {len(train)} train tasks have no number in "
        f"metadata['operations'] ({', '.join(t.uid for t in train[:3])} and {len(train) - 3} more); the ladder sorts "
        "tasks by it (data=arithmetic gives 'operations')"]
    check_data_and_reward(parts, TASKS, [])  # arithmetic tasks say their length: nothing to report
