"""One number read exactly, as answers are written: integers, decimals with or without a leading digit (`.5`, `-.5`),
thousands separators in groups of three (`1,234,567`; `1,2` is not a number), currency (`$1,200.50`), percent (`50%`
reads as 50, the GSM8K convention) and fractions (`-3/4`, `-(3)/(4)`). The data reads its reference answers with it,
the rewards their completions' final answers (`rewards.answers`), so both sides agree on what a number is."""

from __future__ import annotations

import re
from fractions import Fraction

_THOUSANDS = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?")


def parse_number(answer: str) -> Fraction | None:
    """Parse "1,200", "$5", "3.50", "-7", ".5", "50%", "3/4", "-(3)/(4)" into an exact Fraction; None if it is
    not one number."""
    cleaned = answer.strip().replace("\u2212", "-").replace("$", "").replace("%", "").replace(" ", "").rstrip(".")
    sign = 1
    if cleaned.startswith("-"):
        sign, cleaned = -1, cleaned[1:]
    parts = cleaned.split("/")
    if len(parts) > 2:
        return None
    values = [_plain_number(p[1:-1] if p.startswith("(") and p.endswith(")") else p) for p in parts]
    if any(v is None for v in values):
        return None
    if len(values) == 2:
        return None if values[1] == 0 else sign * values[0] / values[1]  # type: ignore[operator]
    return sign * values[0]  # type: ignore[operator]


def _plain_number(text: str) -> Fraction | None:
    if "," in text:
        if not _THOUSANDS.fullmatch(text.lstrip("+-")):
            return None  # "1,2" is a list, not twelve
        text = text.replace(",", "")
    if not re.fullmatch(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)", text):
        return None  # Fraction() would also take "1e3", "nan", "inf"
    return Fraction(text)
