"""Prompt rendering with the model's own chat template. The engine only ever sees token ids."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

from grpo_pipe.types import Task


def render_prompt(tokenizer: PreTrainedTokenizerBase, system_prompt: str, task: Task) -> tuple[int, ...]:
    messages = chat_messages(system_prompt, task)
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert isinstance(text, str)  # tokenize=False: the rendered text
    return tuple(tokenizer(text, add_special_tokens=False)["input_ids"])


def chat_messages(system_prompt: str, task: Task) -> list[dict[str, str]]:
    """The conversation the model sees: the task's own messages (chat datasets), else system prompt + question.

    A task's messages that carry no system message get the data source's system prompt in front."""
    if task.messages is not None:
        messages = [dict(m) for m in task.messages]
        if system_prompt and not any(m.get("role") == "system" for m in messages):
            messages.insert(0, {"role": "system", "content": system_prompt})
        return messages
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages.append({"role": "user", "content": task.question})
    return messages


def cut_to(prompt: tuple[int, ...], limit: int | None) -> tuple[int, ...]:
    """`prompt` as an engine with room for `limit` prompt tokens takes it (`run.overlong_prompts=truncate`): cut from
    the left, so the question's end and the answer cue stay."""
    return prompt[-limit:] if limit is not None and len(prompt) > limit else prompt


def a_few(names: Sequence[str], shown: int = 3) -> str:
    """`a, b, c and 4 more`: what a warning about many items names, never a line per item."""
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")
