"""The samples table: a few completions of each step with their rewards, and an episode's turns in order."""

from __future__ import annotations

from grpo_pipe.runner.step_metrics import rollout_metrics, sample_rows
from grpo_pipe.types import Completion, EpisodeLog, RequestTelemetry, RewardOutput, RolloutGroup, Task, Turn

TELEMETRY = RequestTelemetry(prompt_tokens=0, generated_tokens=0, cached_prompt_tokens=0)


def test_rows_keep_the_first_completions_and_show_an_episode_turn_by_turn() -> None:
    turns = (Turn(role="assistant", text="<calculator>3 * 25</calculator>"), Turn(role="tool", text="75", tool="calculator"),
             Turn(role="assistant", text="#### 75"))
    episode = Completion(token_ids=(), logprobs=(), text="#### 75", finish_reason="stop", policy_version=2, telemetry=TELEMETRY,
                         episode=EpisodeLog(turns=turns, model_turns=2, tool_calls=1))
    plain = Completion(token_ids=(), logprobs=(), text="#### 9", finish_reason="stop", policy_version=2, telemetry=TELEMETRY)
    groups = [RolloutGroup(Task(uid="t/1", question="Calculate 3 * 25.", answer="75"), (), (episode, plain, plain))]
    rows = sample_rows(7, groups, RewardOutput(values=[1.0, 0.0, 0.5]), keep=2)
    assert [r["reward"] for r in rows] == [1.0, 0.0] and rows[0]["step"] == 7
    assert rows[0]["turns"] == [
        {"role": "assistant", "text": "<calculator>3 * 25</calculator>"},
        {"role": "tool", "text": "75", "tool": "calculator", "outcome": "ok"},
        {"role": "assistant", "text": "#### 75"},
    ]
    assert rows[0]["ended_by"] == "answer" and "turns" not in rows[1]


def test_the_cached_share_of_episodes_is_of_every_turns_prompt() -> None:
    """An episode's turns re-read its history; what the cache served is a share of all the tokens read, never above 1."""
    read = RequestTelemetry(prompt_tokens=10 + 30 + 50, generated_tokens=9, cached_prompt_tokens=0 + 28 + 48)
    episode = Completion(token_ids=(1,) * 9, logprobs=(0.0,) * 9, text="", finish_reason="stop", policy_version=0, telemetry=read,
                         episode=EpisodeLog(turns=(), model_turns=3, tool_calls=2))
    groups = [RolloutGroup(Task(uid="t/1", question="q", answer="1"), (0,) * 10, (episode, episode))]
    assert rollout_metrics(groups, 1.0)["rollout/cached_prompt_fraction"] == 76 / 90


def test_the_step_line_says_n_a_for_what_a_step_could_not_measure() -> None:
    from grpo_pipe.runner.progress import summary_line

    line = summary_line(3, 10, {"train/reward/mean": 0.5, "train/loss": 0.0, "train/update_applied": 0.0,
                                "train/clip_fraction": 0.0, "mismatch/logprob_abs_mean": float("nan")})
    assert "reward 0.500" in line and "acc n/a" in line and "loss n/a" in line and "mismatch n/a" in line
    assert "clip n/a" in line and "nan" not in line
    trained = summary_line(4, 10, {"train/loss": -0.25, "train/update_applied": 1.0, "train/active_samples": 8.0,
                                   "train/clip_fraction": 0.1})
    assert "loss n/a" in summary_line(5, 10, {"train/loss": 0.0, "train/update_applied": 1.0, "train/active_samples": 0.0})
    assert "loss -0.2500" in trained and "clip 0.100" in trained


def test_the_step_line_shows_the_updates_speed_and_mfu_only_where_the_peak_is_known() -> None:
    from grpo_pipe.runner.progress import summary_line

    on_gpu = summary_line(2, 10, {"train/tokens_per_s": 51234.4, "train/mfu": 0.2093})
    assert "train 51234 tok/s mfu 20.9%" in on_gpu
    on_cpu = summary_line(2, 10, {"train/tokens_per_s": 812.0})
    assert "train 812 tok/s mfu n/a" in on_cpu and "nan" not in on_cpu
    assert "train " not in summary_line(2, 10, {})  # no update ran: nothing to show
