"""Small format rewards written as plain TRL-style functions (usable with `reward=python`)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

_MARKED_LAST_LINE = re.compile(r"####\s*\S+[^\n]*\s*$")
# "#### <number>" and nothing after it but white space: the reply stops where its answer ends.
_ANSWER_AT_END = re.compile(r"####[ \t]*-?\d[\d,]*(?:\.\d+)?\s*$")


def ends_with_marked_answer(completions: Sequence[str], **_: Any) -> list[float]:
    """1.0 when the reply's last line is the `#### <answer>` line the system prompts ask for, else 0.0."""
    return [1.0 if _MARKED_LAST_LINE.search(text) else 0.0 for text in completions]


def answer_ends_the_reply(completions: Sequence[str | Sequence[Mapping[str, str]]], **_: Any) -> list[float]:
    """1.0 when the reply ends with `#### <number>`, nothing after the number, else 0.0. Words before it are allowed
    (`Now 49. #### 49`, where the examples restate what is left before every turn).

    Why: the correctness check reads the number after `####` and ignores what follows, so a policy may run on after its
    answer to the token limit at no cost. Those tokens share the episode's advantage and, under an entropy bonus or
    floor, are where entropy is cheapest to buy (seen in the calculator runs: `#### 30500Vanacos</tool_response>...`),
    away from the decisions that matter, such as whether to call the tool again. For an episode (a list of messages),
    the last assistant turn is the reply.
    """
    return [1.0 if _ANSWER_AT_END.search(_reply(c)) else 0.0 for c in completions]


def _reply(completion: str | Sequence[Mapping[str, str]]) -> str:
    if isinstance(completion, str):
        return completion
    turns = [m.get("content", "") for m in completion if m.get("role") == "assistant"]
    return turns[-1] if turns else ""
