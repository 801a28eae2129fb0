"""Which held-out prompts an evaluation may send: the engine refuses one that leaves no room for the budget."""

import logging

from grpo_pipe.evaluation.held_out import fit_held_out
from grpo_pipe.types import Task


def _tasks(n: int) -> list[Task]:
    return [Task(uid=f"t{i}", question=f"q{i}", answer="1") for i in range(n)]


def test_skip_leaves_out_prompts_that_do_not_fit_and_names_them(caplog) -> None:
    prompts = [(1,) * 3, (2,) * 6, (3,) * 5, (4,) * 9]
    with caplog.at_level(logging.WARNING):
        kept, tasks = fit_held_out(prompts, _tasks(4), limit=5, overlong="skip")
    assert kept == [(1,) * 3, (3,) * 5] and [t.uid for t in tasks] == ["t0", "t2"]
    assert "2 of 4 held-out task(s)" in caplog.text and "t1 (6 tokens), t3 (9 tokens)" in caplog.text


def test_truncate_keeps_every_task_and_cuts_from_the_left() -> None:
    kept, tasks = fit_held_out([(1, 2, 3, 4, 5, 6), (7, 8)], _tasks(2), limit=4, overlong="truncate")
    assert kept == [(3, 4, 5, 6), (7, 8)] and len(tasks) == 2


def test_prompts_that_fit_pass_unchanged_without_a_warning(caplog) -> None:
    prompts = [(1, 2), (3,)]
    with caplog.at_level(logging.WARNING):
        assert fit_held_out(prompts, _tasks(2), limit=2, overlong="skip") == (prompts, _tasks(2))
    assert caplog.text == ""
