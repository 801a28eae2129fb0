"""The one error a bad config raises, whoever finds the problem (validation or a constructor)."""

from __future__ import annotations

from collections.abc import Sequence


class ConfigError(ValueError):
    """One or more invalid config values; the message lists every problem found."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("Invalid config:\n" + "\n".join(f"  - {p}" for p in self.problems))
