"""Held-out evaluation with greedy decoding, scored by the same function as the reward."""

from __future__ import annotations

from collections.abc import Sequence

from grpo_pipe.interfaces import RolloutEngine
from grpo_pipe.rewards.answers import is_correct
from grpo_pipe.types import SamplingSettings, Task


def evaluate(
    engine: RolloutEngine, prompts: Sequence[tuple[int, ...]], tasks: Sequence[Task], max_tokens: int
) -> dict[str, float]:
    """Accuracy and mean answer length of one greedy completion per held-out task."""
    if not tasks:
        return {}
    greedy = SamplingSettings(temperature=0.0, top_p=1.0, max_tokens=max_tokens)
    results = engine.generate(prompts, [1] * len(prompts), greedy)
    completions = [r[0] for r in results]
    correct = [is_correct(c.text, t.answer) is True for c, t in zip(completions, tasks)]
    return {
        "eval/accuracy": sum(correct) / len(correct),
        "eval/generated_tokens_mean": sum(len(c.token_ids) for c in completions) / len(completions),
        "eval/truncated_fraction": sum(c.finish_reason == "length" for c in completions) / len(completions),
    }
