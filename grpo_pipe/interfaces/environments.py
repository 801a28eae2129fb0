"""Episodes: how a rendered prompt becomes a completion, in one engine call or over several turns with tools."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

from grpo_pipe.interfaces.engines import PendingRollout, RolloutEngine
from grpo_pipe.types import Completion, SamplingSettings, Task


@runtime_checkable
class Environment(Protocol):
    """The `environment` config group: renders each task's prompt and runs its episodes on the engine.

    `single_turn` is one engine call per batch (what every run did before episodes). A multi-turn runner sends
    all live episodes' next turns to the engine in one call and returns, per episode, one completion whose token
    ids are every token after the prompt, exactly as the engine produced and was fed them, with
    `Completion.sampled_by_model` telling the model's tokens from the environment's."""

    def setup(self, tokenizer: PreTrainedTokenizerBase, system_prompt: str, max_model_len: int) -> None:
        """Before the first rollout (the model's tokenizer exists now): build the chat glue, the tool schemas.

        Args:
            tokenizer: The model's tokenizer, whose chat template renders prompts and turns.
            system_prompt: The data's system prompt, put first in every prompt.
            max_model_len: The engine's limit on prompt plus completion tokens of one request, for a runner whose
                episodes must fit in it.
        """
        ...

    def completion_budget(self, max_new_tokens: int) -> int:
        """Tokens an episode may add after its prompt (one turn: `max_new_tokens`); prompts must leave room.

        Args:
            max_new_tokens: The run's budget for one model turn (`run.max_new_tokens`).
        """
        ...

    def render_prompt(self, task: Task) -> tuple[int, ...]:
        """The prompt's token ids: the task in the model's chat template (with the tools, where there are any).

        Args:
            task: The task whose prompt is rendered.
        """
        ...

    def submit(
        self, engine: RolloutEngine, tasks: Sequence[Task], prompts: Sequence[Sequence[int]], samples: Sequence[int],
        sampling: SamplingSettings,
    ) -> PendingRollout:
        """`samples[i]` episodes of task i, started now; the batch is waited for through the handle.

        Args:
            engine: The engine every turn is generated on.
            tasks: The tasks, one per prompt (a tool or environment may read the task's reference).
            prompts: Each task's prompt token ids, from `render_prompt`.
            samples: How many episodes each task gets.
            sampling: The sampling settings of every model turn.
        """
        ...

    def generate(
        self, engine: RolloutEngine, tasks: Sequence[Task], prompts: Sequence[Sequence[int]], samples: Sequence[int],
        sampling: SamplingSettings,
    ) -> list[list[Completion]]:
        """As `submit`, waited for here (held-out evaluation).

        Args:
            engine: The engine every turn is generated on.
            tasks: The tasks, one per prompt.
            prompts: Each task's prompt token ids, from `render_prompt`.
            samples: How many episodes each task gets.
            sampling: The sampling settings of every model turn.
        """
        ...

    def close(self) -> None:
        """Stop episodes still running (at their next turn) and release what the tools hold."""
        ...
