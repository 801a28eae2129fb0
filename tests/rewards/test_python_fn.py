"""reward=python: a TRL-style function gets per-completion columns (metadata included); None and bad returns."""

from pathlib import Path

import pytest

from grpo_pipe.rewards.python_fn import PythonFunctionReward
from grpo_pipe.types import Completion, RequestTelemetry, RolloutGroup, Task

SEEN: dict = {}


def record_and_score(completions, prompts, answers, level, **kwargs):
    SEEN.update(completions=completions, prompts=prompts, answers=answers, level=level, extra=sorted(kwargs))
    return [None if c == "skip" else float(c == a) + 0.1 * lv for c, a, lv in zip(completions, answers, level)]


def only_completions(completions):
    return [0.5] * len(completions)


def wrong_length(completions, **_):
    return [1.0]


def _completion(text: str) -> Completion:
    return Completion((1, 2), (-0.1, -0.2), text, "stop", 0, RequestTelemetry(3, 2, 0))


def _groups() -> list[RolloutGroup]:
    first = Task("a", "q1", "7", metadata={"level": 1})
    second = Task("b", "q2", "8", metadata={"level": 2}, messages=({"role": "user", "content": "q2"},))
    return [
        RolloutGroup(first, (1,), (_completion("7"), _completion("6"))),
        RolloutGroup(second, (1,), (_completion("8"), _completion("skip"))),
    ]


def test_function_gets_columns_per_completion_and_none_counts_as_none_value() -> None:
    reward = PythonFunctionReward(f"{__name__}:record_and_score", none_value=-1.0, success_at=1.0)
    out = reward(_groups())
    assert out.values == pytest.approx([1.1, 0.1, 1.2, -1.0])
    assert out.correct == [True, False, True, False]
    assert out.terms["record_and_score/applies"] == [1.0, 1.0, 1.0, 0.0]
    assert SEEN["answers"] == ["7", "7", "8", "8"] and SEEN["level"] == [1, 1, 2, 2]
    assert SEEN["prompts"][0] == "q1" and SEEN["prompts"][2] == [{"role": "user", "content": "q2"}]
    assert SEEN["extra"] == ["completion_ids"]


def test_function_receives_only_the_arguments_it_names() -> None:
    out = PythonFunctionReward(f"{__name__}:only_completions", name="half", success_at=None)(_groups())
    assert out.values == [0.5] * 4 and out.correct is None and "half" in out.terms


def test_a_function_from_a_file_path(tmp_path: Path) -> None:
    (tmp_path / "mine.py").write_text("def score(completions, **kw):\n    return [len(c) for c in completions]\n")
    reward = PythonFunctionReward(f"{tmp_path}/mine.py:score")
    assert reward.config_problems() == [] and reward(_groups()).values == [1.0, 1.0, 1.0, 4.0]


def test_a_wrong_number_of_values_is_an_error() -> None:
    with pytest.raises(ValueError, match="returned 1 values for 4 completions"):
        PythonFunctionReward(f"{__name__}:wrong_length")(_groups())


@pytest.mark.parametrize("spec", ["no_colon", "no_such_module_xyz:score", f"{__name__}:missing", "nofile.py:score"])
def test_unimportable_functions_are_config_problems(spec: str) -> None:
    (problem,) = PythonFunctionReward(spec).config_problems()
    assert problem.startswith(f"fn={spec!r}: cannot be imported")
    assert "allowed: 'package.module:function' or 'path/to/file.py:function'" in problem
