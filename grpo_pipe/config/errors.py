"""The one error a bad config raises: every problem, from validation and from each component's `config_problems`,
collected by `runner.components.build` into one list."""

from __future__ import annotations

from collections.abc import Sequence


class ConfigError(ValueError):
    """One or more invalid config values; the message lists every problem found."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("Invalid config:\n" + "\n".join(f"  - {p}" for p in self.problems))


def failed(*checks: tuple[bool, str]) -> list[str]:
    """The messages of the checks that do not hold: a component's `config_problems` in one expression, each rule
    a (condition, message) pair beside the others of its component."""
    return [message for ok, message in checks if not ok]
