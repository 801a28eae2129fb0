"""Final-answer extraction and exact numeric equivalence for math answers, and the verifier choice.

The reward and the evaluation both call `is_correct`, so they cannot drift apart. A final answer is read as a
number by `data.numbers.parse_number` (the data's reference answers are read the same way); LaTeX in `\\boxed{}`
(`\\frac{a}{b}`, `\\dfrac`, `\\tfrac`, `-\\frac`, `\\$`, `\\%`, `\\text{units}`) is made plain first. Anything
else in a box is not a number, so it is unparsable, never a different number that might happen to match.

Two verifiers share one surface (`verifier(text, reference) -> True | False | None`):
`BuiltinVerifier` (this parser, offline, the default) and `MathVerifyVerifier` (Hugging Face's
`math-verify`, symbolic equivalence, the optional extra `grpo_pipe[math]`).
"""

from __future__ import annotations

import re
import threading
from typing import Protocol

from grpo_pipe.data.numbers import parse_number

_SIGN = r"(?:(?<![\w)\]])[-\u2212]\s?)?"  # a minus that is not a subtraction ("x-5", "3-2")
_DIGITS = r"(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"
_NUMBER = _SIGN + r"\$?\s?" + _DIGITS + r"(?:\s?/\s?\d+)?%?"
# Ordered from most to least explicit: the first pattern that matches wins.
_HASHES = re.compile(r"####\s*(" + _NUMBER + ")")
_ANSWER_IS = re.compile(r"answer\s*(?:is|:|=)\s*[:=]?\s*\**\s*(" + _NUMBER + ")", re.IGNORECASE)
_ANY_NUMBER = re.compile(_NUMBER)
_FRAC = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_FRAC_SHORT = re.compile(r"\\[dt]?frac\s*(\d)\s*(\d)")  # \frac12


def extract_answer(text: str) -> str | None:
    """Return the final answer in `text` as written (e.g. "1,200", "-3/4"), or None if there is none.

    Marked answers (`#### N`, `\\boxed{...}`, "the answer is N") win over the last number in the text.
    For a marked answer the LAST occurrence counts, since models often restate the question first.
    """
    found = _HASHES.findall(text)
    if found:
        return found[-1].strip()
    boxed = _boxed_contents(text)
    if boxed:
        return latex_to_plain(boxed[-1])
    found = _ANSWER_IS.findall(text)
    if found:
        return found[-1].strip()
    numbers = _ANY_NUMBER.findall(text)
    return numbers[-1].strip() if numbers else None


def _boxed_contents(text: str) -> list[str]:
    """The contents of every `\\boxed{...}` / `\\fbox{...}`, nested braces matched."""
    out = []
    for match in re.finditer(r"\\(?:boxed|fbox)\s*\{", text):
        depth, start = 1, match.end()
        for index in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[index], 0)
            if depth == 0:
                out.append(text[start:index])
                break
    return out


def latex_to_plain(latex: str) -> str:
    """`-\\dfrac{3}{4}` -> `-(3)/(4)`, `\\$1{,}200` -> `$1,200`, `x = 5` -> `5`; other LaTeX is left as is."""
    s = re.sub(r"\\text\s*\{[^{}]*\}", "", latex)  # units: 5\text{ apples}
    s = re.sub(r"\\(?:mathrm|textbf|mathbf|displaystyle)\s*(?:\{([^{}]*)\})?", r"\1", s)
    for old, new in (("\\$", "$"), ("\\%", "%"), ("{,}", ","), ("\\!", ""), ("\\,", ""), ("\\ ", ""),
                     ("\\left", ""), ("\\right", "")):
        s = s.replace(old, new)
    s = re.sub(r"\^\s*\{?\\circ\}?", "", s)
    s = _FRAC.sub(r"(\1)/(\2)", s)
    s = _FRAC_SHORT.sub(r"\1/\2", s)
    if "=" in s:
        s = s.rsplit("=", 1)[1]
    return s.strip().rstrip(".")


def is_correct(text: str, reference: str) -> bool | None:
    """True/False when `text` has a numeric final answer; None when no answer can be parsed."""
    predicted = extract_answer(text)
    if predicted is None:
        return None
    value = parse_number(predicted)
    if value is None:
        return None
    target = parse_number(reference)
    return target is not None and value == target


class Verifier(Protocol):
    """Grades one completion against a reference answer: True, False, or None when no answer is found."""

    def __call__(self, text: str, reference: str) -> bool | None: ...


class BuiltinVerifier:
    """This module's parser: exact numbers, offline, no dependency.

    It finds the final answer as `#### N`, `\\boxed{N}`, "the answer is N", else the last number. Takes no arguments.
    """

    def __call__(self, text: str, reference: str) -> bool | None:
        return is_correct(text, reference)


class MathVerifyVerifier:
    """Hugging Face's `math-verify` (symbolic equivalence of LaTeX and plain expressions).

    Needs the optional extra `grpo_pipe[math]` (`pip install math-verify`); its reward reports a missing
    package with the config's problems, before any model loads.

    Args:
        timeout_s: math-verify's parsing timeout per answer, in seconds (applied on the main thread only: it uses
            SIGALRM).
    """

    def __init__(self, timeout_s: int = 5) -> None:
        self.timeout_s = timeout_s

    def config_problems(self) -> list[str]:
        try:
            import math_verify  # noqa: F401
        except ImportError:
            return ["verifier=MathVerifyVerifier needs the `math-verify` package (pip install 'grpo_pipe[math]'); "
                    "the built-in parser (BuiltinVerifier) works offline"]
        return []

    def __call__(self, text: str, reference: str) -> bool | None:
        from math_verify import parse, verify

        # math-verify's timeouts use SIGALRM, which only the main thread may set.
        timeout = self.timeout_s if threading.current_thread() is threading.main_thread() else 0  # 0: no timeout
        predicted = parse(text, parsing_timeout=timeout)
        if not predicted:
            return None
        gold = parse(reference, parsing_timeout=timeout)
        return bool(gold) and bool(verify(gold, predicted, timeout_seconds=timeout))
