"""Turning table rows (JSONL, parquet, Hugging Face datasets) into tasks, the same way for every source.

A row gives a prompt (text, or chat messages), a reference answer and any metadata columns, which travel
with the task to the reward. A row that cannot be used is named (file and line); it is an error unless
`data.max_bad_fraction` lets a share of them be skipped and counted.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from grpo_pipe.types import Task

log = logging.getLogger(__name__)

# A task whose metadata has this key (a generated task's length, a row's column of that name) is also counted in the
# held-out metrics of its group: `eval/accuracy/<group>` beside `eval/accuracy`.
EVAL_GROUP_KEY = "eval_group"


@dataclass
class SkippedRows:
    """Rows left out of a dataset, with why: reported as a metric and in the log.

    Args:
        reasons: One line per skipped row, naming where it is and why it was skipped.
    """

    reasons: list[str] = field(default_factory=list)

    def add(self, where: str, why: str) -> None:
        self.reasons.append(f"{where}: {why}")
        log.warning("Skipping data row %s: %s", where, why)

    def __len__(self) -> int:
        return len(self.reasons)

    def __iter__(self) -> Iterator[str]:
        return iter(self.reasons)

    def __contains__(self, reason: object) -> bool:
        return reason in self.reasons


def bad_rows_problem(skipped: Sequence[str], usable: int, max_fraction: float) -> str | None:
    """A problem when more rows were unusable than `data.max_bad_fraction` allows, naming the first ones."""
    total = usable + len(skipped)
    if not skipped or len(skipped) <= max_fraction * total:
        return None
    named = "; ".join(skipped[:5]) + (f"; ... ({len(skipped) - 5} more)" if len(skipped) > 5 else "")
    return (f"data: {len(skipped)} of {total} rows cannot be used ({named}); fix them, or allow a share to be "
            f"skipped and counted with data.max_bad_fraction (now {max_fraction}, needed >= {len(skipped) / total:.3f})")


@dataclass(frozen=True, kw_only=True)
class RowFormat:
    """Which columns of a row hold what.

    Args:
        prompt_key: The column with the prompt: text, or a list of {"role", "content"} messages.
        answer_key: The column with the reference answer.
        metadata_keys: Columns passed to the reward; None = every other column.
        answer_after: E.g. `####`: the reference is the text after the last marker.
        max_prompt_chars: Longer prompts are skipped and counted.
    """

    prompt_key: str = "prompt"
    answer_key: str = "answer"
    metadata_keys: tuple[str, ...] | None = None
    answer_after: str | None = None
    max_prompt_chars: int = 20_000

    def missing_columns(self, columns: Iterable[str]) -> list[str]:
        present = set(columns)
        wanted = [self.prompt_key, self.answer_key, *(self.metadata_keys or ())]
        return [c for c in wanted if c not in present]

    def column_problems(self, columns: Iterable[str], source: str) -> list[str]:
        """Config problems for a source whose rows have `columns` (read from its first row or schema)."""
        columns = list(columns)
        keys = {self.prompt_key: "prompt_key", self.answer_key: "answer_key"}
        return [
            f"{keys.get(c, 'metadata_keys')}={c!r}: no such column in {source}; columns: {', '.join(sorted(columns))}"
            for c in self.missing_columns(columns)
        ]

    def to_task(self, row: Mapping[str, Any], uid: str, skipped: SkippedRows) -> Task | None:
        """The task of one row, or None (skipped, with the reason) when the row cannot be used."""
        missing = [c for c in (self.prompt_key, self.answer_key) if row.get(c) is None]
        if missing:
            skipped.add(uid, f"no value in column(s) {', '.join(missing)}")
            return None
        question, messages = _prompt(row[self.prompt_key])
        if question is None:
            skipped.add(uid, f"column {self.prompt_key!r} is neither text nor a list of chat messages")
            return None
        if not question.strip() or len(question) > self.max_prompt_chars:
            skipped.add(uid, f"prompt has {len(question)} chars (allowed: 1..{self.max_prompt_chars})")
            return None
        answer = self._answer(row[self.answer_key])
        if answer is None:
            skipped.add(uid, f"no reference answer after {self.answer_after!r} in column {self.answer_key!r}")
            return None
        keys = self.metadata_keys if self.metadata_keys is not None else [
            k for k in row if k not in (self.prompt_key, self.answer_key)
        ]
        metadata = {k: row.get(k) for k in keys}
        return Task(uid=uid, question=question.strip(), answer=answer, metadata=metadata, messages=messages)

    def _answer(self, value: Any) -> str | None:
        text = str(value).strip()
        if self.answer_after is None:
            return text or None
        if self.answer_after not in text:
            return None
        return text.rsplit(self.answer_after, 1)[1].strip().replace(",", "") or None


def _prompt(value: Any) -> tuple[str | None, tuple[Mapping[str, str], ...] | None]:
    """(question text, chat messages or None). The question of a chat prompt is its last user message."""
    if isinstance(value, str):
        return value, None
    if isinstance(value, Sequence) and value and all(_is_message(m) for m in value):
        messages = tuple({"role": str(m["role"]), "content": str(m["content"])} for m in value)
        users = [m["content"] for m in messages if m["role"] == "user"]
        return (users[-1] if users else messages[-1]["content"]), messages
    return None, None


def _is_message(item: Any) -> bool:
    return isinstance(item, Mapping) and "role" in item and "content" in item


def rows_to_tasks(
    rows: Iterable[Mapping[str, Any] | None], source: str, row_format: RowFormat, skipped: SkippedRows
) -> list[Task]:
    """Every usable row of `rows` as a task with uid `source:<row number from 1>`; None rows (blank
    lines, or rows the reader already counted as skipped) are passed over."""
    tasks = [
        row_format.to_task(row, f"{source}:{i}", skipped) for i, row in enumerate(rows, start=1) if row is not None
    ]
    return [t for t in tasks if t is not None]


def hold_out(tasks: Sequence[Task], fraction: float, seed: int) -> tuple[list[Task], list[Task]]:
    """(train, eval): a seeded random `fraction` of `tasks` held out; the same seed gives the same split."""
    order = list(range(len(tasks)))
    random.Random(seed).shuffle(order)
    cut = round(len(tasks) * fraction)
    held = set(order[:cut])
    return [t for i, t in enumerate(tasks) if i not in held], [t for i, t in enumerate(tasks) if i in held]


def limit(tasks: list[Task], count: int | None) -> list[Task]:
    return tasks if count is None else tasks[:count]


@dataclass(kw_only=True, eq=False)
class SplitTaskSource:
    """What every file-backed task source shares (`data=gsm8k`, `data=jsonl`, `data=hf`): the size limits, the
    system prompt, the share of rows that may be skipped, the skipped rows, and the splits read once. A source is a
    dataclass of its own settings on top of these (the config's keys are the fields of all, flat: `data.max_train`)
    and reads its rows in `read_splits`.

    Args:
        max_train: At most this many train tasks; None = all.
        max_eval: At most this many eval tasks; None = all.
        system_prompt: The system message put first in every prompt.
        max_bad_fraction: Share of rows that may be skipped (counted); 0 = a skipped row is an error.
    """

    max_train: int | None = None
    max_eval: int | None = None
    system_prompt: str = ""
    max_bad_fraction: float = 0.0
    skipped: SkippedRows = field(init=False, repr=False, default_factory=lambda: SkippedRows())
    _split: tuple[list[Task], list[Task]] | None = field(init=False, repr=False, default=None)

    def train_tasks(self) -> list[Task]:
        return limit(self._splits()[0], self.max_train)

    def eval_tasks(self) -> list[Task]:
        return limit(self._splits()[1], self.max_eval)

    def read_splits(self) -> tuple[list[Task], list[Task] | None]:
        """The train tasks, and the eval tasks when the source has its own (None: `held_out` makes them)."""
        raise NotImplementedError

    def held_out(self, train: list[Task]) -> tuple[list[Task], list[Task]]:
        """(train, eval) for a source without eval rows of its own."""
        raise NotImplementedError(f"{type(self).__name__} reads eval rows of its own")

    def _splits(self) -> tuple[list[Task], list[Task]]:
        if self._split is None:
            train, evaluation = self.read_splits()
            self._split = (train, evaluation) if evaluation is not None else self.held_out(train)
            log.info("data: %d train, %d eval tasks; %d rows skipped", *map(len, self._split), len(self.skipped))
        return self._split


@dataclass(kw_only=True, eq=False)
class RowTaskSource(SplitTaskSource):
    """Sources of table rows (`data=jsonl`, `data=hf`): which columns hold the prompt, the answer and the metadata,
    and a seeded held-out fraction of the train rows where there are no eval rows.

    Args:
        max_train: At most this many train tasks; None = all.
        max_eval: At most this many eval tasks; None = all.
        system_prompt: The system message put first in every prompt.
        max_bad_fraction: Share of rows that may be skipped (counted); 0 = a skipped row is an error.
        prompt_key: The column with the question text or chat messages.
        answer_key: The column with the reference answer.
        metadata_keys: Columns that travel with the task to the reward; None = every other column.
        answer_after: The answer is what follows this marker in the answer column.
        max_prompt_chars: Longer prompts are skipped and counted.
        eval_fraction: Seeded held-out fraction of the train rows, used only when the source has no eval rows of its
            own.
        seed: The seed of the held-out fraction.
    """

    prompt_key: str = "prompt"
    answer_key: str = "answer"
    metadata_keys: list[str] | None = None
    answer_after: str | None = None
    max_prompt_chars: int = 20_000
    eval_fraction: float = 0.1
    seed: int = 0
    format: RowFormat = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.format = row_format(self.prompt_key, self.answer_key, self.metadata_keys, self.answer_after,
                                 self.max_prompt_chars)

    def held_out(self, train: list[Task]) -> tuple[list[Task], list[Task]]:
        return hold_out(train, self.eval_fraction, self.seed)


def row_format(prompt_key: str, answer_key: str, metadata_keys: list[str] | None, answer_after: str | None,
               max_prompt_chars: int) -> RowFormat:
    """The config's column settings as a RowFormat (metadata_keys: null = every other column)."""
    return RowFormat(prompt_key=prompt_key, answer_key=answer_key,
                     metadata_keys=None if metadata_keys is None else tuple(metadata_keys), answer_after=answer_after,
                     max_prompt_chars=max_prompt_chars)
