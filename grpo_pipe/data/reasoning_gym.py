"""Procedural tasks from the `reasoning-gym` library, generated offline from a seed.

Train and eval use different seeds; any eval question that also occurs in train is dropped, so the
two splits never overlap. Each task carries its reasoning-gym entry as metadata (`reasoning_gym`), so
`reward=reasoning_gym` can score it with the library's own scorer: needed for tasks whose answers are
not numbers (words, letters, lists), which the default numeric `reward=correctness` cannot judge.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from grpo_pipe.data.generated import GeneratedSplits
from grpo_pipe.types import Task


class ReasoningGymTasks:
    """One reasoning-gym task family (e.g. `basic_arithmetic`) with its difficulty settings.

    Generated offline; eval tasks that repeat a train question are dropped.

    Args:
        task: The reasoning-gym dataset name (e.g. `basic_arithmetic`, `spell_backward`).
        train_size: Train tasks generated.
        eval_size: Held-out tasks generated.
        seed: The generator's seed.
        difficulty: The dataset's own settings (for `basic_arithmetic`: `min_terms`, `max_digits`, `operators`, ...).
        system_prompt: The system message put first in every prompt.
    """

    def __init__(
        self,
        *,
        task: str = "basic_arithmetic",
        train_size: int = 2000,
        eval_size: int = 100,
        seed: int = 0,
        difficulty: Mapping[str, Any] | None = None,
        system_prompt: str = "",
    ) -> None:
        self.task = task
        self.train_size = train_size
        self.eval_size = eval_size
        self.seed = seed
        self.difficulty = dict(difficulty or {})
        self.system_prompt = system_prompt
        self.skipped: tuple[str, ...] = ()  # generated tasks are never malformed (TaskSource.skipped)
        self.max_bad_fraction = 0.0
        # Eval oversampled 4×: small difficulty settings repeat questions often, and those in train are dropped.
        self.splits = GeneratedSplits(self._generate, train_size=train_size, eval_size=eval_size, seed=seed,
                                      oversample=4, name=task)

    def _generate(self, size: int, seed: int, split: str) -> list[Task]:
        import reasoning_gym

        dataset = reasoning_gym.create_dataset(self.task, size=size, seed=seed, **self.difficulty)
        return [
            Task(
                uid=f"{self.task}/{split}/{seed}/{i}",
                question=item["question"],
                answer=str(item["answer"]),
                metadata={"reasoning_gym": item},
            )
            for i, item in enumerate(dataset)
        ]

    def train_tasks(self) -> list[Task]:
        return self.splits.train()

    def eval_tasks(self) -> list[Task]:
        return self.splits.eval()
