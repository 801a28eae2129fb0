"""Prompt rendering with the model's own chat template. The engine only ever sees token ids."""

from __future__ import annotations

from typing import Any

from grpo_pipe.types import Task


def render_prompt(tokenizer: Any, system_prompt: str, task: Task) -> tuple[int, ...]:
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages.append({"role": "user", "content": task.question})
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tuple(tokenizer(text, add_special_tokens=False)["input_ids"])
