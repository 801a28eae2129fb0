"""Arithmetic expressions generated offline from a seed, answered with the usual precedence (`*` before `+` and `-`).

Made for tool use: with 2-3 digit numbers and a few operations, the answer is out of reach of a small model's
head, and a calculator that takes one operation per call needs several calls chained. (reasoning-gym's
`basic_arithmetic` without parentheses grades `19 + 45 - 26 * 98` left to right, as 3724: not usable here.)
Train and eval use different seeds; an eval question that also occurs in train is dropped.
Each task also carries `metadata["steps"]`: the value after each operation of one correct evaluation (products first,
left to right, then sums and differences left to right; the last is the answer), for a reward that gives credit for
the intermediate results an episode reached (`reward=calculator_steps`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from grpo_pipe.config.errors import failed
from grpo_pipe.types import Task

OPERATORS = ("+", "-", "*")


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
    """`terms` numbers of `min_digits`..`max_digits` digits joined by `operators` (`data=arithmetic`)."""

    def __init__(
        self,
        *,
        terms: int = 4,
        min_digits: int = 2,
        max_digits: int = 3,
        operators: Sequence[str] = OPERATORS,
        train_size: int = 2000,
        eval_size: int = 100,
        seed: int = 0,
        system_prompt: str = "",
    ) -> None:
        self.terms, self.min_digits, self.max_digits = terms, min_digits, max_digits
        self.operators = list(operators)
        self.train_size, self.eval_size, self.seed = train_size, eval_size, seed
        self.system_prompt = system_prompt
        self.skipped: tuple[str, ...] = ()  # generated tasks are never malformed (TaskSource.skipped)
        self.max_bad_fraction = 0.0
        self._train: list[Task] | None = None
        self._eval: list[Task] | None = None

    def config_problems(self) -> list[str]:
        return failed(
            (self.terms >= 2, f"data.terms={self.terms}: must be >= 2"),
            (1 <= self.min_digits <= self.max_digits, f"data.min_digits={self.min_digits}, "
                                                      f"data.max_digits={self.max_digits}: need 1 <= min_digits <= max_digits"),
            (bool(self.operators) and set(self.operators) <= set(OPERATORS),
             f"data.operators={self.operators}: allowed: a non-empty subset of {list(OPERATORS)}"),
        )

    def _generate(self, size: int, seed: int, split: str) -> list[Task]:
        rng = random.Random(seed)
        tasks, seen = [], set()
        while len(tasks) < size:
            numbers = [rng.randint(10 ** (d - 1), 10**d - 1)
                       for d in (rng.randint(self.min_digits, self.max_digits) for _ in range(self.terms))]
            ops = [rng.choice(self.operators) for _ in range(self.terms - 1)]
            text = " ".join(f"{n} {op}" for n, op in zip(numbers, ops)) + f" {numbers[-1]}"
            if text in seen:
                continue
            seen.add(text)
            values = steps(numbers, ops)
            tasks.append(Task(uid=f"arithmetic/{split}/{seed}/{len(tasks)}", question=f"Calculate {text}.",
                              answer=str(values[-1]), metadata={"steps": [str(v) for v in values]}))
        return tasks

    def train_tasks(self) -> list[Task]:
        if self._train is None:
            self._train = self._generate(self.train_size, self.seed, "train")
        return self._train

    def eval_tasks(self) -> list[Task]:
        if self._eval is None:
            seen = {t.question for t in self.train_tasks()}
            candidates = self._generate(self.eval_size * 2, self.seed + 1_000_003, "eval")
            self._eval = [t for t in candidates if t.question not in seen][: self.eval_size]
        return self._eval
