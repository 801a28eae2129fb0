"""The samples table: a few completions of each step with their rewards, and an episode's turns in order."""

from __future__ import annotations

from grpo_pipe.step_metrics import sample_rows
from grpo_pipe.types import Completion, EpisodeLog, RequestTelemetry, RewardOutput, RolloutGroup, Task, Turn

TELEMETRY = RequestTelemetry(prompt_tokens=0, generated_tokens=0, cached_prompt_tokens=0)


def test_rows_keep_the_first_completions_and_show_an_episode_turn_by_turn() -> None:
    turns = (Turn("assistant", "<calculator>3 * 25</calculator>"), Turn("tool", "75", tool="calculator"),
             Turn("assistant", "#### 75"))
    episode = Completion((), (), "#### 75", "stop", 2, TELEMETRY, episode=EpisodeLog(turns, model_turns=2, tool_calls=1))
    plain = Completion((), (), "#### 9", "stop", 2, TELEMETRY)
    groups = [RolloutGroup(Task("t/1", "Calculate 3 * 25.", "75"), (), (episode, plain, plain))]
    rows = sample_rows(7, groups, RewardOutput(values=[1.0, 0.0, 0.5]), keep=2)
    assert [r["reward"] for r in rows] == [1.0, 0.0] and rows[0]["step"] == 7
    assert rows[0]["turns"] == [
        {"role": "assistant", "text": "<calculator>3 * 25</calculator>"},
        {"role": "tool", "text": "75", "tool": "calculator", "outcome": "ok"},
        {"role": "assistant", "text": "#### 75"},
    ]
    assert rows[0]["ended_by"] == "answer" and "turns" not in rows[1]
