"""The one error a bad config raises: every problem, from validation and from each component's `config_problems`,
collected by `runner.components.build` into one list. `InputError` is its kind for what only loading an input can
reveal (a data file's rows, a checkpoint, a hub repository, the tracking server): the same format, raised where the
input is read, since no rule on the config could have known it."""

from __future__ import annotations

from collections.abc import Sequence


class ConfigError(ValueError):
    """One or more invalid config values; the message lists every problem found.

    Args:
        problems: Every problem found, each naming the key, its value and what is allowed.
    """

    heading = "Invalid config"

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__(f"{self.heading}:\n" + "\n".join(f"  - {p}" for p in self.problems))


class InputError(ConfigError):
    """What reading an input found wrong after the config passed: the same one list of problems, each naming the input
    and what to change. Raised where the input is read (data rows, a resume checkpoint, a hub repository, a tracking
    server), never for a rule that the config alone decides: that is a `config_problems` entry.

    Args:
        problems: Every problem found, each naming the input and what to change.
    """

    heading = "Invalid input"


def failed(*checks: tuple[bool, str]) -> list[str]:
    """The messages of the checks that do not hold: a component's `config_problems` in one expression, each rule
    a (condition, message) pair beside the others of its component."""
    return [message for ok, message in checks if not ok]
