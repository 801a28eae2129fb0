"""`reward=reasoning_gym`: reasoning-gym tasks scored by reasoning-gym's own scorer (`score_answer`).

Our numeric `correctness` reward can only judge numbers; reasoning-gym tasks answer with words, letter
sequences, lists or expressions, each with its own scorer (exact match, partial credit, equivalence).
The answer is what follows the last `####` marker on its line (the system prompt asks for it), else the
last `<answer>...</answer>`; no answer scores 0. Needs tasks from `data=reasoning_gym`, which carry their
reasoning-gym entry as metadata.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

import torch

from grpo_pipe.types import RewardOutput, RolloutGroup

_ANSWER_TAG = re.compile(r"<answer>\s?(.*?)\s?</answer>", re.DOTALL)
Scorer = Callable[[str | None, dict[str, Any]], float]
ENTRY_KEY = "reasoning_gym"  # the Task.metadata key that holds the reasoning-gym entry


def extract_marked_answer(text: str, marker: str = "####") -> str | None:
    """The text after the last `marker` up to the end of its line, else the last <answer> tag's content."""
    if marker in text:
        answer = text.rsplit(marker, 1)[1].strip().split("\n", 1)[0].strip()
        return answer or None
    tags = _ANSWER_TAG.findall(text)
    return tags[-1].strip() if tags else None


class ReasoningGymScore:
    """Scores each completion with the scorer of the reasoning-gym dataset its task came from.

    Use with `data=reasoning_gym`: words, letters, lists, expressions are scored, not only numbers.

    Args:
        marker: The answer is what follows the last marker on its line (else `<answer>...</answer>`).
        success_at: A score >= this counts as solved (eval/accuracy, pass@k).
    """

    def __init__(self, marker: str = "####", success_at: float = 1.0) -> None:
        self.marker = marker
        self.success_at = success_at  # a score >= this counts as solved (eval accuracy, pass@k)
        self._scorers: dict[str, Scorer] = {}

    def setup(self, model_path: Path, kv_dtype: torch.dtype) -> None:
        pass  # needs nothing from the model

    def __call__(self, groups: Sequence[RolloutGroup]) -> RewardOutput:
        values: list[float] = []
        parsed: list[float] = []
        for group in groups:
            entry = group.task.metadata.get(ENTRY_KEY)
            if entry is None:
                raise ValueError(
                    f"reward=reasoning_gym: task {group.task.uid} has no reasoning-gym entry; use data=reasoning_gym"
                )
            score = self._scorer(entry["metadata"]["source_dataset"])
            for completion in group.completions:
                answer = extract_marked_answer(completion.text, self.marker)
                parsed.append(0.0 if answer is None else 1.0)
                values.append(float(score(answer, entry)) if answer is not None else 0.0)
        correct = [v >= self.success_at for v in values]
        return RewardOutput(values=values, terms={"score": list(values), "parsable": parsed}, correct=correct)

    def _scorer(self, dataset_name: str) -> Scorer:
        if dataset_name not in self._scorers:
            import reasoning_gym

            # The library annotates the scorer as taking no arguments; it is `score_answer(answer, entry)`.
            self._scorers[dataset_name] = cast(Scorer, reasoning_gym.get_score_answer_fn(dataset_name))
        return self._scorers[dataset_name]
