"""Credit for the intermediate results an episode's tools returned: only listed steps count, as exact numbers,
only from calls that succeeded, and a task without steps is named before the engine starts."""

from __future__ import annotations

from grpo_pipe.rewards.tool_steps import ToolStepsReward
from grpo_pipe.types import Completion, EpisodeLog, RequestTelemetry, RolloutGroup, Task, Turn

TASK = Task(uid="a/1", question="Calculate 38 - 673 + 851.", answer="216", metadata={"steps": ["-635", "216"]})
NO_TELEMETRY = RequestTelemetry(prompt_tokens=0, generated_tokens=0, cached_prompt_tokens=0)


def episode(*results: tuple[str, str]) -> Completion:
    turns = tuple(t for text, outcome in results for t in (Turn(role="assistant", text="<calculator>…</calculator>"),
                                                            Turn(role="tool", text=text, tool="calculator", outcome=outcome)))
    return Completion(token_ids=(), logprobs=(), text="#### ?", finish_reason="stop", policy_version=0, telemetry=NO_TELEMETRY,
                      episode=EpisodeLog(turns=turns, model_turns=len(results) + 1, tool_calls=len(results)))


def scores(*completions: Completion, task: Task = TASK) -> list[float]:
    return ToolStepsReward()([RolloutGroup(task, (), completions)]).values


def test_each_step_a_successful_call_returned_earns_its_share() -> None:
    assert scores(episode(("-635", "ok"), ("216", "ok"))) == [1.0]
    assert scores(episode(("-635/1", "ok"))) == [0.5]  # exact numbers, not strings
    assert scores(episode(("216", "ok"), ("-635", "ok"), ("216", "ok"))) == [1.0]  # order and repeats do not matter


def test_results_no_step_names_errors_and_plain_turns_earn_nothing() -> None:
    assert scores(episode(("1", "ok"), ("2", "ok"), ("3", "ok"))) == [0.0]  # calling more cannot raise the score
    assert scores(episode(("-635", "error"), ("216", "timeout"))) == [0.0]
    plain = Completion(token_ids=(), logprobs=(), text="#### 216", finish_reason="stop", policy_version=0, telemetry=NO_TELEMETRY)
    assert scores(plain) == [0.0]


def test_a_task_without_steps_scores_zero_is_counted_and_named_before_the_engine_starts() -> None:
    bare = Task(uid="a/2", question="Calculate 1 + 2.", answer="3")
    out = ToolStepsReward()([RolloutGroup(bare, (), (episode(("3", "ok")),))])
    assert out.values == [0.0] and out.terms["no_steps"] == [1.0]
    assert ToolStepsReward().try_on([TASK]) == []
    [problem] = ToolStepsReward(key="path").try_on([TASK, bare])
    assert "key='path'" in problem and "a/1, a/2" in problem
