"""`environment=single_turn` (the default): one prompt, one completion, one engine call per batch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

from grpo_pipe.data.prompts import render_prompt
from grpo_pipe.interfaces import PendingRollout, RolloutEngine
from grpo_pipe.types import Completion, SamplingSettings, Task


class SingleTurn:
    """Each task's prompt in the model's chat template, its completions from one engine call: what every run did
    before episodes, unchanged (the engine is handed exactly the same call).

    `environment=single_turn`, the default. Takes no arguments.
    """

    def __init__(self) -> None:
        self._tokenizer: Any = None
        self._system_prompt = ""

    def setup(self, tokenizer: PreTrainedTokenizerBase, system_prompt: str, max_model_len: int) -> None:
        self._tokenizer = tokenizer
        self._system_prompt = system_prompt

    def completion_budget(self, max_new_tokens: int) -> int:
        return max_new_tokens

    def render_prompt(self, task: Task) -> tuple[int, ...]:
        if self._tokenizer is None:
            raise RuntimeError("environment used before setup()")
        return render_prompt(self._tokenizer, self._system_prompt, task)

    def submit(self, engine: RolloutEngine, tasks: Sequence[Task], prompts: Sequence[Sequence[int]],
               samples: Sequence[int], sampling: SamplingSettings) -> PendingRollout:
        return engine.submit(prompts, samples, sampling)

    def generate(self, engine: RolloutEngine, tasks: Sequence[Task], prompts: Sequence[Sequence[int]],
                 samples: Sequence[int], sampling: SamplingSettings) -> list[list[Completion]]:
        return engine.generate(prompts, samples, sampling)

    def close(self) -> None:
        """Nothing of its own to release."""
