"""reward=reasoning_gym: a non-numeric reasoning-gym task earns reward from the library's own scorer."""

from grpo_pipe.data.reasoning_gym import ReasoningGymTasks
from grpo_pipe.rewards.correctness import CorrectnessReward
from grpo_pipe.rewards.reasoning_gym_score import (
    ReasoningGymScore,
    extract_marked_answer,
)
from grpo_pipe.types import Completion, RequestTelemetry, RolloutGroup


def _group(task, texts):
    completions = tuple(Completion(token_ids=(1,), logprobs=(-0.1,), text=t, finish_reason="stop", policy_version=0,
                                   telemetry=RequestTelemetry(prompt_tokens=2, generated_tokens=1,
                                                              cached_prompt_tokens=0)) for t in texts)
    return RolloutGroup(task, (1, 2), completions)


def test_a_word_task_earns_reward_that_numeric_correctness_cannot_give() -> None:
    task = ReasoningGymTasks(task="spell_backward", train_size=4, eval_size=1, difficulty={}).train_tasks()[0]
    word = task.answer
    assert not any(ch.isdigit() for ch in word)
    texts = [f"Reversed, it reads:\n#### {word}", f"<answer>{word}</answer>", "#### nonsense", "no idea"]
    group = _group(task, texts)
    scored = ReasoningGymScore()([group])
    assert scored.values[:2] == [1.0, 1.0] and scored.values[3] == 0.0
    assert scored.correct == [True, True, False, False]
    assert scored.terms["parsable"] == [1.0, 1.0, 1.0, 0.0]
    assert CorrectnessReward()([group]).values == [0.0] * 4  # the numeric reward gives a word task nothing


def test_answer_extraction() -> None:
    assert extract_marked_answer("think\n#### a, b, c\nthanks") == "a, b, c"
    assert extract_marked_answer("<answer> x </answer> then <answer>y</answer>") == "y"
    assert extract_marked_answer("####   ") is None and extract_marked_answer("plain") is None
