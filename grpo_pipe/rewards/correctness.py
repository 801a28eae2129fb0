"""Answer-correctness reward: a fixed value for correct, wrong and unparsable final answers."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from grpo_pipe.interfaces import ChecksItsConfig
from grpo_pipe.rewards.answers import BuiltinVerifier, Verifier
from grpo_pipe.types import RewardOutput, RolloutGroup


class CorrectnessReward:
    """Scores each completion's final answer against the task's reference answer.

    The seed designs used correct/wrong = 1.0/-0.2 and 1.0/0.0; both are one override away.

    Args:
        correct: The reward of a completion whose final answer matches the reference.
        wrong: The reward of an answer that does not match (the seed designs used 0.0 and -0.2).
        unparsable: The reward of a completion in which no final answer is found.
        verifier: What grades an answer: `BuiltinVerifier` (exact numbers, offline) or `MathVerifyVerifier`
            (math-verify, extra `grpo_pipe[math]`); None = the built-in one.
    """

    def __init__(
        self, *, correct: float = 1.0, wrong: float = 0.0, unparsable: float = 0.0, verifier: Verifier | None = None
    ) -> None:
        self.verifier = verifier or BuiltinVerifier()
        self.correct = correct
        self.wrong = wrong
        self.unparsable = unparsable

    def config_problems(self) -> list[str]:
        # a verifier with a dependency of its own says so
        return self.verifier.config_problems() if isinstance(self.verifier, ChecksItsConfig) else []

    def setup(self, model_path: Path, kv_dtype: torch.dtype) -> None:
        pass  # needs nothing from the model

    def __call__(self, groups: Sequence[RolloutGroup]) -> RewardOutput:
        values: list[float] = []
        correct: list[bool] = []
        parsed: list[float] = []
        for group in groups:
            for completion in group.completions:
                verdict = self.verifier(completion.text, group.task.answer)
                correct.append(verdict is True)
                parsed.append(0.0 if verdict is None else 1.0)
                if verdict is None:
                    values.append(self.unparsable)
                else:
                    values.append(self.correct if verdict else self.wrong)
        return RewardOutput(
            values=values,
            terms={"correctness": list(values), "parsable": parsed},
            correct=correct,
        )
