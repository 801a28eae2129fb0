"""Small format rewards written as plain TRL-style functions (usable with `reward=python`)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

_MARKED_LAST_LINE = re.compile(r"####\s*\S+[^\n]*\s*$")


def ends_with_marked_answer(completions: Sequence[str], **_: Any) -> list[float]:
    """1.0 when the reply's last line is the `#### <answer>` line the system prompts ask for, else 0.0."""
    return [1.0 if _MARKED_LAST_LINE.search(text) else 0.0 for text in completions]
