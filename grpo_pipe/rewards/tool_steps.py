"""Credit for the intermediate results an episode's tools returned: partial credit on the way to an answer.

    value = |the task's steps that some tool call of the episode returned| / |the task's steps|

A task lists its steps in `metadata[key]` (`data=arithmetic` gives the value after each operation of one correct
evaluation). A step counts when a tool call that succeeded returned it (compared as exact numbers, so "75" and
"75/1" agree); order and repeats do not matter, and a result no step names earns nothing, so calling the tool more
cannot raise the score: only results on the way to the answer do. Used beside correctness (`reward=calculator_steps`)
where a task is out of the untrained model's reach: a group whose episodes all miss the answer still tells the
episodes that got part of the way from those that did not, so GRPO has an advantage to follow.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path

import torch

from grpo_pipe.types import Completion, RewardOutput, RolloutGroup, Task


class ToolStepsReward:
    """The share of the task's steps that some successful tool call of the episode returned (see the module's docstring).

    Args:
        key: The task metadata key that lists the task's steps (`data=arithmetic` gives `steps`).
    """

    def __init__(self, key: str = "steps") -> None:
        self.key = key  # the Task.metadata key that lists a task's steps

    def setup(self, model_path: Path, kv_dtype: torch.dtype) -> None:
        pass  # needs nothing from the model

    def try_on(self, tasks: Sequence[Task]) -> list[str]:
        """The data must list steps: without them every episode would score 0 and the term would teach nothing."""
        lacking = [t.uid for t in tasks if not steps_of(t, self.key)]
        return [f"key={self.key!r}: tasks {', '.join(lacking)} list no steps in metadata[{self.key!r}] (a list of "
                "numbers; data=arithmetic gives them)"] if lacking else []

    def __call__(self, groups: Sequence[RolloutGroup]) -> RewardOutput:
        values, missing = [], []
        for group in groups:
            wanted = steps_of(group.task, self.key)
            for completion in group.completions:
                missing.append(float(not wanted))
                reached = wanted & tool_results(completion)
                values.append(len(reached) / len(wanted) if wanted else 0.0)
        return RewardOutput(values=values, terms={"steps": list(values), "no_steps": missing})


def steps_of(task: Task, key: str) -> set[Fraction]:
    listed = task.metadata.get(key)
    if not isinstance(listed, Sequence) or isinstance(listed, str):
        return set()
    return {number for number in map(as_number, listed) if number is not None}


def tool_results(completion: Completion) -> set[Fraction]:
    """The numbers the episode's successful tool calls returned (none for a completion without an episode)."""
    if completion.episode is None:
        return set()
    numbers = (as_number(t.text) for t in completion.episode.turns if t.role == "tool" and t.outcome == "ok")
    return {n for n in numbers if n is not None}


def as_number(value: object) -> Fraction | None:
    try:
        return Fraction(str(value).strip())
    except (ValueError, ZeroDivisionError):
        return None
