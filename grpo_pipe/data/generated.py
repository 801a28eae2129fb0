"""Train and held-out splits of a task generator (`data=arithmetic`, `data=reasoning_gym`), made once each, on first use.

The held-out split comes from a seed stream of its own (`seed + EVAL_SEED_OFFSET`), oversampled, and keeps only
questions the train split does not hold, each once: the two splits never overlap, whatever the generator.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from grpo_pipe.types import Task

log = logging.getLogger(__name__)

EVAL_SEED_OFFSET = 1_000_003  # the held-out split's seed is the train seed plus this: two streams that never meet

# generate(size, seed, split) -> `size` tasks, the same ones for the same arguments
Generate = Callable[[int, int, str], list[Task]]
# arrange(unseen held-out candidates, eval_size) -> the held-out split: by default the first `eval_size`
Arrange = Callable[[list[Task], int], list[Task]]


def first(tasks: list[Task], size: int) -> list[Task]:
    return tasks[:size]


class GeneratedSplits:
    """The splits of one generator, each generated on its first use and kept.

    Args:
        generate: makes `size` tasks from `seed`; `split` ("train" or "eval") goes into their uids.
        train_size: tasks in the train split.
        eval_size: tasks in the held-out split (fewer, with a warning, when too few candidates are not in train).
        seed: the train split's seed; the held-out split's is `seed + EVAL_SEED_OFFSET`.
        oversample: held-out candidates generated per held-out task, so dropping the ones train holds leaves enough.
        arrange: picks the held-out split from the candidates left (e.g. balanced over task lengths).
        name: what the warning calls these tasks.
    """

    def __init__(self, generate: Generate, *, train_size: int, eval_size: int, seed: int, oversample: int = 2,
                 arrange: Arrange = first, name: str = "generated") -> None:
        self.generate = generate
        self.train_size, self.eval_size, self.seed = train_size, eval_size, seed
        self.oversample = oversample
        self.arrange = arrange
        self.name = name
        self._train: list[Task] | None = None
        self._eval: list[Task] | None = None

    def train(self) -> list[Task]:
        if self._train is None:
            self._train = self.generate(self.train_size, self.seed, "train")
        return self._train

    def eval(self) -> list[Task]:
        if self._eval is None:
            candidates = self.generate(self.eval_size * self.oversample, self.seed + EVAL_SEED_OFFSET, "eval")
            self._eval = self.arrange(unseen(candidates, self.train()), self.eval_size)
            if len(self._eval) < self.eval_size:
                log.warning("data.eval_size=%d but only %d %s questions are not in the train split; lower "
                            "data.train_size or make the tasks harder for a larger held-out set",
                            self.eval_size, len(self._eval), self.name)
        return self._eval


def unseen(candidates: Sequence[Task], train: Sequence[Task]) -> list[Task]:
    """The candidates whose question the train split does not hold, each question once: at the place of its first
    candidate, as its last (a generator that repeats a question gives the same split as before this helper)."""
    seen = {t.question for t in train}
    kept = {t.question: t for t in candidates if t.question not in seen}
    return list(kept.values())
