"""Arithmetic expressions generated offline from a seed, answered with the usual precedence (`*` before `+` and `-`).

Made for tool use: with 2-3 digit numbers and a few operations, the answer is out of reach of a small model's
head, and a calculator that takes one operation per call needs several calls chained. (reasoning-gym's
`basic_arithmetic` without parentheses grades `19 + 45 - 26 * 98` left to right, as 3724: not usable here.)
Train and eval use different seeds; an eval question that also occurs in train is dropped.
Each task also carries `metadata["steps"]`: the value after each operation of one correct evaluation (products first,
left to right, then sums and differences left to right; the last is the answer), for a reward that gives credit for
the intermediate results an episode reached (`reward=calculator_steps`).

Tasks may be of several lengths: `terms=[2, 4]` makes 2-, 3- and 4-term expressions in equal shares (task i of a split
has the i-th length in turn), and `eval_terms` gives the held-out split lengths of its own, e.g. one longer than any
trained on. Each task says how long it is: `metadata["operations"]` (terms − 1: the calls a one-operation calculator
needs) and `metadata["eval_group"]` (`terms_3`), by which the held-out evaluation also reports accuracy per length
(`eval/accuracy/terms_3`). The held-out split takes its lengths in turn, so any first part of it (`run.eval_size`, the
episodes shown each evaluation) holds every length.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from itertools import chain, zip_longest

from grpo_pipe.config.errors import failed
from grpo_pipe.data.generated import GeneratedSplits
from grpo_pipe.data.rows import EVAL_GROUP_KEY
from grpo_pipe.types import Task

OPERATORS = ("+", "-", "*")
Terms = int | Sequence[int]  # N terms, or [low, high]: every length from low to high


def as_terms(value: Terms | None) -> Terms | None:
    """A range from the config (a ListConfig, a tuple) as a plain list; anything else as it came."""
    return list(value) if isinstance(value, Sequence) and not isinstance(value, str) else value


def lengths(terms: Terms | None) -> list[int]:
    """The term counts `terms` stands for: [N] for N, low..high for [low, high]; [] when it is neither."""
    if isinstance(terms, int):
        return [terms]
    if isinstance(terms, Sequence) and not isinstance(terms, str) and len(terms) == 2 and all(
            isinstance(t, int) for t in terms):
        return list(range(terms[0], terms[1] + 1))
    return []


def evaluate(numbers: Sequence[int], operators: Sequence[str]) -> int:
    """The value of `n0 op0 n1 op1 n2 ...` with `*` first, then `+` and `-` left to right."""
    return steps(numbers, operators)[-1]


def steps(numbers: Sequence[int], operators: Sequence[str]) -> list[int]:
    """The value after each operation of `n0 op0 n1 op1 n2 ...`: every `*` left to right, then `+` and `-` left to
    right; one value per operator, the last of them the expression's value."""
    values, after = list(numbers[:1]), []
    signs = []
    for op, number in zip(operators, numbers[1:]):
        if op == "*":
            values[-1] *= number
            after.append(values[-1])
        else:
            values.append(number)
            signs.append(op)
    total = values[0]
    for op, number in zip(signs, values[1:]):
        total = total + number if op == "+" else total - number
        after.append(total)
    return after if after else [numbers[0]]


class ArithmeticTasks:
    """`terms` numbers of `min_digits`..`max_digits` digits joined by `operators` (`data=arithmetic`); `terms` and
    `eval_terms` are a count or a [low, high] range of counts.

    Each task's metadata gives its length (`operations`, `eval_group`) and its intermediate results (`steps`).

    Args:
        terms: Numbers per expression: a count, or [low, high]: every count from low to high, in equal shares.
        eval_terms: The held-out split's counts (a count or [low, high]); None = the same as `terms`.
        min_digits: Fewest digits of a number.
        max_digits: Most digits of a number.
        operators: The operators drawn from (usual precedence).
        train_size: Train tasks generated.
        eval_size: Held-out tasks generated.
        seed: The generator's seed.
        system_prompt: The system message put first in every prompt.
    """

    def __init__(
        self,
        *,
        terms: Terms = 4,
        eval_terms: Terms | None = None,
        min_digits: int = 2,
        max_digits: int = 3,
        operators: Sequence[str] = OPERATORS,
        train_size: int = 2000,
        eval_size: int = 100,
        seed: int = 0,
        system_prompt: str = "",
    ) -> None:
        self.terms, self.eval_terms = as_terms(terms), as_terms(eval_terms)
        self.min_digits, self.max_digits = min_digits, max_digits
        self.operators = list(operators)
        self.train_size, self.eval_size, self.seed = train_size, eval_size, seed
        self.system_prompt = system_prompt
        self.skipped: tuple[str, ...] = ()  # generated tasks are never malformed (TaskSource.skipped)
        self.max_bad_fraction = 0.0
        self.splits = GeneratedSplits(self._generate, train_size=train_size, eval_size=eval_size, seed=seed,
                                      arrange=by_length_in_turn, name="arithmetic")

    def config_problems(self) -> list[str]:
        allowed = "must be >= 2, or a range [low, high] with 2 <= low <= high"
        return failed(
            (min(lengths(self.terms), default=0) >= 2, f"data.terms={self.terms}: {allowed}"),
            (self.eval_terms is None or min(lengths(self.eval_terms), default=0) >= 2,
             f"data.eval_terms={self.eval_terms}: {allowed}, or null (the train lengths)"),
            (1 <= self.min_digits <= self.max_digits, f"data.min_digits={self.min_digits}, "
                                                      f"data.max_digits={self.max_digits}: need 1 <= min_digits <= max_digits"),
            (bool(self.operators) and set(self.operators) <= set(OPERATORS),
             f"data.operators={self.operators}: allowed: a non-empty subset of {list(OPERATORS)}"),
        )

    @property
    def train_lengths(self) -> list[int]:
        return lengths(self.terms)

    @property
    def eval_lengths(self) -> list[int]:
        return lengths(self.terms if self.eval_terms is None else self.eval_terms)

    def _generate(self, size: int, seed: int, split: str) -> list[Task]:
        """`size` tasks, task i of the length `i mod` the split's lengths (one length: the same tasks as ever)."""
        counts = self.train_lengths if split == "train" else self.eval_lengths
        rng = random.Random(seed)
        tasks, seen = [], set()
        while len(tasks) < size:
            terms = counts[len(tasks) % len(counts)]
            numbers = [rng.randint(10 ** (d - 1), 10**d - 1)
                       for d in (rng.randint(self.min_digits, self.max_digits) for _ in range(terms))]
            ops = [rng.choice(self.operators) for _ in range(terms - 1)]
            text = " ".join(f"{n} {op}" for n, op in zip(numbers, ops)) + f" {numbers[-1]}"
            if text in seen:
                continue
            seen.add(text)
            values = steps(numbers, ops)
            metadata = {"steps": [str(v) for v in values], "operations": terms - 1, EVAL_GROUP_KEY: f"terms_{terms}"}
            tasks.append(Task(uid=f"arithmetic/{split}/{seed}/{len(tasks)}", question=f"Calculate {text}.",
                              answer=str(values[-1]), metadata=metadata))
        return tasks

    def train_tasks(self) -> list[Task]:
        return self.splits.train()

    def eval_tasks(self) -> list[Task]:
        return self.splits.eval()


def by_length_in_turn(tasks: list[Task], size: int) -> list[Task]:
    """The first `size` of `tasks` taken one length at a time, shortest first (2, 3, 4, 2, 3, 4, ...): any first
    part of the split holds every length in equal shares. One length: the first `size`, as they came."""
    by_length: dict[int, list[Task]] = {}
    for task in tasks:
        by_length.setdefault(int(task.metadata["operations"]), []).append(task)
    rows = zip_longest(*(by_length[n] for n in sorted(by_length)))
    return [t for t in chain.from_iterable(rows) if t is not None][:size]
