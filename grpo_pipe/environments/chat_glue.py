"""The tokens the environment adds between two model turns, taken from the model's own chat template.

After a model turn the conversation goes on with: the end of the assistant's message (unless the model sampled it
itself), the tool result's message, and the opening of the next assistant message. The template renders that text;
it is tokenized once, on its own, and appended to the episode's tokens. The model's turns are never decoded and
tokenized again: the episode's token ids are exactly those the engine sampled and those it was fed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_MARK = "\u2063GRPO_PIPE_TURN_END\u2063"  # invisible separator: text no template or model turn contains


class ChatGlue:
    """Renders the text between two model turns with the model's chat template, and tokenizes it on its own.

    Args:
        tokenizer: The model's tokenizer, whose chat template renders the glue and whose end-of-turn token ends a turn.
        system_prompt: The system message of the conversation rendered around the glue; empty: a placeholder.
    """

    def __init__(self, tokenizer: Any, system_prompt: str) -> None:
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt or "S"
        self.eos_text: str = tokenizer.eos_token or ""
        self.eos_id: int | None = tokenizer.eos_token_id

    def after_turn(self, result: Mapping[str, str], model_ended_turn: bool) -> tuple[int, ...]:
        """Token ids that follow a model turn: its end (unless the model sampled the end itself), `result`'s message,
        and the next assistant message's opening. Raises ValueError when the template cannot render the result."""
        text = self._glue_text(result)
        if model_ended_turn and self.eos_text and text.startswith(self.eos_text):
            text = text[len(self.eos_text) :]  # the model already wrote the end-of-turn token
        return tuple(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _glue_text(self, result: Mapping[str, str]) -> str:
        messages = [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": "Q"},
                    {"role": "assistant", "content": _MARK}, dict(result)]
        rendered = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        at = rendered.find(_MARK)
        if at < 0:
            raise ValueError("the chat template drops the assistant's message content; it cannot carry tool turns")
        return rendered[at + len(_MARK) :]

    def ended_turn(self, token_ids: tuple[int, ...]) -> bool:
        """Whether the model's turn ends with the end-of-turn token it sampled."""
        return bool(token_ids) and self.eos_id is not None and token_ids[-1] == self.eos_id
