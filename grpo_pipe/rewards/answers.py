"""Final-answer extraction and numeric equivalence for GSM8K-style outputs.

The reward and the evaluation both call `is_correct`, so they cannot drift apart.
"""

from __future__ import annotations

import re
from fractions import Fraction

_NUMBER = r"-?\$?\s?\d[\d,]*(?:\.\d+)?(?:/\d+)?"
# Ordered from most to least explicit: the first pattern that matches wins.
_MARKED_PATTERNS = (
    re.compile(r"####\s*(" + _NUMBER + ")"),
    re.compile(r"\\boxed\{\s*(" + _NUMBER + r")[^}]*\}"),
    re.compile(r"answer\s*(?:is|:|=)\s*[:=]?\s*\**\s*(" + _NUMBER + ")", re.IGNORECASE),
)
_ANY_NUMBER = re.compile(_NUMBER)


def extract_answer(text: str) -> str | None:
    """Return the final answer in `text` as written (e.g. "1,200"), or None if there is none.

    Marked answers (`#### N`, `\\boxed{N}`, "the answer is N") win over the last number in the text.
    For a marked answer the LAST occurrence counts, since models often restate the question first.
    """
    for pattern in _MARKED_PATTERNS:
        found = pattern.findall(text)
        if found:
            return found[-1].strip()
    numbers = _ANY_NUMBER.findall(text)
    return numbers[-1].strip() if numbers else None


def parse_number(answer: str) -> Fraction | None:
    """Parse "1,200", "$5", "3.50", "-7", "3/4" into an exact Fraction; None if it is not a number."""
    cleaned = answer.replace(",", "").replace("$", "").replace(" ", "").rstrip(".")
    try:
        return Fraction(cleaned)
    except (ValueError, ZeroDivisionError):
        return None


def is_correct(text: str, reference: str) -> bool | None:
    """True/False when `text` has a numeric final answer; None when no answer can be parsed."""
    predicted = extract_answer(text)
    if predicted is None:
        return None
    value = parse_number(predicted)
    target = parse_number(reference)
    if value is None:
        return None
    return target is not None and value == target
