"""Held-out metrics per group of tasks: a task whose metadata names its group (`eval_group`, e.g. `terms_3` for a
three-term expression of `data=arithmetic`) is counted in its group's metrics as well as in the whole split's:

- `eval/accuracy/<group>`: the share of the group the reward counts as solved (absent when it has no such notion);
- `eval/reward/mean/<group>`: the group's mean reward;
- `eval/calls_match/<group>` (and `eval/calls_match` over all groups): among solved episodes of tasks that say how
  many operations they need (`metadata["operations"]`), the share that called a tool exactly that many times. A
  model that learned one fixed number of calls scores 1 on the length it copied and 0 on the others.

So a run on tasks of several lengths shows which lengths it learned, and whether the skill holds on a length it never
trained on. The episodes shown to people take the groups in turn (`in_turn`), so each group has one on the page.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain, zip_longest
from typing import TypeVar

from grpo_pipe.data.rows import EVAL_GROUP_KEY
from grpo_pipe.types import Completion, RewardOutput, Task

OPERATIONS_KEY = "operations"  # the metadata key saying how many operations (tool calls) a task needs

Item = TypeVar("Item")


def group_of(task: Task) -> str | None:
    group = task.metadata.get(EVAL_GROUP_KEY)
    return None if group is None else str(group)


def group_metrics(tasks: Sequence[Task], completions: Sequence[Completion], scored: RewardOutput) -> dict[str, float]:
    """The metrics above for one greedy completion per task ([T] each); {} when no task names a group or its operations."""
    metrics: dict[str, float] = {}
    members: dict[str, list[int]] = {}
    for index, task in enumerate(tasks):
        group = group_of(task)
        if group is not None:
            members.setdefault(group, []).append(index)
    for group, indices in members.items():
        metrics[f"eval/reward/mean/{group}"] = sum(scored.values[i] for i in indices) / len(indices)
        if scored.correct is not None:
            metrics[f"eval/accuracy/{group}"] = sum(scored.correct[i] for i in indices) / len(indices)
    if scored.correct is None:
        return metrics
    # [T]: for a solved episode of a task that says its operations, whether it called a tool that many times
    matches = [_calls_match(t, c) if ok else None for t, c, ok in zip(tasks, completions, scored.correct)]
    metrics.update(_share("eval/calls_match", [m for m in matches if m is not None]))
    for group, indices in members.items():
        metrics.update(_share(f"eval/calls_match/{group}", [m for i in indices if (m := matches[i]) is not None]))
    return metrics


def _calls_match(task: Task, completion: Completion) -> bool | None:
    """Whether the episode made as many tool calls as the task has operations; None when either is not known."""
    operations = task.metadata.get(OPERATIONS_KEY)
    if not isinstance(operations, int) or completion.episode is None:
        return None
    return completion.episode.tool_calls == operations


def _share(key: str, flags: Sequence[bool]) -> dict[str, float]:
    return {key: sum(flags) / len(flags)} if flags else {}


def in_turn(items: Sequence[Item], tasks: Sequence[Task]) -> list[Item]:
    """`items` (one per task) reordered so the tasks' groups take turns, each keeping its own order: the first few
    hold one of every group. Tasks without a group form one group of their own; no group at all: the order as it was."""
    columns: dict[str | None, list[Item]] = {}
    for item, task in zip(items, tasks):
        columns.setdefault(group_of(task), []).append(item)
    rows = zip_longest(*columns.values())
    return [item for item in chain.from_iterable(rows) if item is not None]
