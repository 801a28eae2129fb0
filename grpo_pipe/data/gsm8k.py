"""GSM8K from local jsonl files (offline) or the public hub dataset (online).

Rows are `{"question": ..., "answer": "...reasoning... #### 72"}`. A row that cannot be parsed or has
no numeric final answer is named (file and line): an error, or skipped and counted within `data.max_bad_fraction`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from grpo_pipe.data.numbers import parse_number
from grpo_pipe.data.rows import SkippedRows, SplitTaskSource, limit
from grpo_pipe.types import Task

log = logging.getLogger(__name__)


def gold_final_answer(solution: str) -> str | None:
    """The number after GSM8K's `####` marker, commas removed; None if absent or not a number."""
    if "####" not in solution:
        return None
    final = solution.rsplit("####", 1)[1].strip().replace(",", "")
    return final if final and parse_number(final) is not None else None


def parse_rows(lines: Sequence[str], source: str, skipped: SkippedRows, max_question_chars: int) -> list[Task]:
    tasks: list[Task] = []
    for line_no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{source}:{line_no}"
        try:
            row = json.loads(line)
            question, solution = row["question"], row["answer"]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            skipped.add(where, f"unparsable row ({type(err).__name__}: {err})")
            continue
        if not isinstance(question, str) or not question.strip():
            skipped.add(where, "empty question")
            continue
        if len(question) > max_question_chars:
            skipped.add(where, f"question has {len(question)} chars > data.max_question_chars={max_question_chars}")
            continue
        answer = gold_final_answer(str(solution))
        if answer is None:
            skipped.add(where, "no numeric final answer after '####'")
            continue
        tasks.append(Task(uid=f"{source}:{line_no}", question=question.strip(), answer=answer))
    return tasks


@dataclass(kw_only=True, eq=False)
class Gsm8kTasks(SplitTaskSource):
    """GSM8K train (for training) and test (for evaluation) splits.

    Local jsonl (offline) when `path` is set, else the public hub dataset.

    Args:
        path: A folder holding the train and eval jsonl files; None: the hub dataset (online).
        hub_id: The hub dataset read when `path` is None.
        train_file: The train split's file name in `path`.
        eval_file: The eval split's file name in `path`.
        max_train: At most this many train tasks; None = all.
        max_eval: At most this many eval tasks; None = all.
        max_question_chars: Longer rows are skipped and counted.
        system_prompt: The system message put first in every prompt.
        max_bad_fraction: Share of rows that may be broken (skipped, counted, named); 0 = a broken row is an error
            naming file and line.
    """

    path: str | None = None  # a folder with the jsonl files; null: the hub dataset (online)
    hub_id: str = "openai/gsm8k"
    train_file: str = "train.jsonl"
    eval_file: str = "test.jsonl"
    max_eval: int | None = 200
    max_question_chars: int = 4000

    _files: dict[str, list[Task]] = field(init=False, repr=False, default_factory=lambda: {})

    # GSM8K's splits are separate files: each is read when first asked for (a folder may hold only the test split).
    def train_tasks(self) -> list[Task]:
        return limit(self._read(self.train_file, "train"), self.max_train)

    def eval_tasks(self) -> list[Task]:
        return limit(self._read(self.eval_file, "test"), self.max_eval)

    def read_splits(self) -> tuple[list[Task], list[Task] | None]:
        return self._read(self.train_file, "train"), self._read(self.eval_file, "test")

    def _read(self, file_name: str, hub_split: str) -> list[Task]:
        if file_name not in self._files:
            lines = self._read_lines(file_name, hub_split)
            self._files[file_name] = parse_rows(lines, f"gsm8k/{file_name}", self.skipped, self.max_question_chars)
        return self._files[file_name]

    def _read_lines(self, file_name: str, hub_split: str) -> list[str]:
        if self.path is not None:
            local = Path(self.path).expanduser() / file_name
            if not local.exists():
                raise FileNotFoundError(f"data.path={self.path!r}: {local} does not exist")
            return local.read_text(encoding="utf-8", errors="replace").splitlines()
        from datasets import load_dataset  # only for online users without a local copy

        rows = cast("Iterable[dict[str, Any]]", load_dataset(self.hub_id, "main", split=hub_split))  # no format set: dicts
        return [json.dumps({"question": r["question"], "answer": r["answer"]}) for r in rows]
