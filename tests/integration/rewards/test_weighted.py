"""reward=weighted: a weighted sum; each reward logged raw and weighted; success from the named reward."""

import pytest

from grpo_pipe.rewards.correctness import CorrectnessReward
from grpo_pipe.rewards.python_fn import PythonFunctionReward
from grpo_pipe.rewards.weighted import WeightedReward
from grpo_pipe.types import Completion, RequestTelemetry, RolloutGroup, Task


def brevity(completions, **_):
    return [1.0 / len(c) for c in completions]


def _groups() -> list[RolloutGroup]:
    texts = ["#### 4", "the answer is 5", "four"]
    completions = tuple(Completion(token_ids=(1,), logprobs=(-0.1,), text=t, finish_reason="stop", policy_version=0,
                                   telemetry=RequestTelemetry(prompt_tokens=2, generated_tokens=1,
                                                              cached_prompt_tokens=0)) for t in texts)
    return [RolloutGroup(Task(uid="t", question="2+2?", answer="4"), (1, 2), completions)]


def test_weighted_sum_raw_and_weighted_terms() -> None:
    reward = WeightedReward(
        {"correctness": CorrectnessReward(wrong=-0.5), "brevity": PythonFunctionReward(fn=f"{__name__}:brevity",
                                                                                       success_at=None)},
        {"correctness": 2.0, "brevity": 0.5},
    )
    assert reward.config_problems() == []
    out = reward(_groups())
    lengths = [6, 15, 4]
    assert out.values == pytest.approx([2.0 * c + 0.5 / n for c, n in zip([1.0, -0.5, 0.0], lengths)])
    assert out.terms["correctness"] == [1.0, -0.5, 0.0]
    assert out.terms["weighted/correctness"] == [2.0, -1.0, 0.0]
    assert out.terms["weighted/brevity"] == pytest.approx([0.5 / n for n in lengths])
    assert out.terms["correctness/parsable"] == [1.0, 1.0, 0.0]
    assert out.correct == [True, False, False]  # the first reward with a notion of success


def test_config_problems_name_weights_and_nested_functions() -> None:
    reward = WeightedReward(
        {"a": CorrectnessReward(), "b": PythonFunctionReward(fn="nope_module:f")}, {"a": 1.0}, success_from="c"
    )
    problems = reward.config_problems()
    assert problems[0] == "weights={'a': 1.0}: need exactly one weight per reward; rewards: a, b"
    assert problems[1] == "success_from='c': allowed: a, b or null"
    assert problems[2].startswith("rewards.b.fn='nope_module:f': cannot be imported")
