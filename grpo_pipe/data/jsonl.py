"""`data=jsonl`: your own tasks from local JSONL or parquet files, with the columns named in the config.

Eval comes from its own file (`eval_path`), or a seeded held-out fraction of the train file. Every column
other than the prompt and the answer (or those listed in `metadata_keys`) travels with its task to the
reward. Unparsable or incomplete rows are named (`skipped`): an error, or skipped and counted within
`data.max_bad_fraction`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_pipe.data.rows import RowFormat, RowTaskSource, SkippedRows, rows_to_tasks
from grpo_pipe.types import Task

log = logging.getLogger(__name__)

SUFFIXES = (".jsonl", ".json", ".parquet")


@dataclass(kw_only=True, eq=False)
class JsonlTasks(RowTaskSource):
    """Tasks from a train file and an eval file (or a held-out fraction of the train file).

    One row per task (`{"prompt": ..., "answer": ..., ...}`); `prompt` may be chat messages. Every other column (or
    only `metadata_keys`) reaches the reward as a keyword argument.

    Args:
        train_path: A .jsonl / .json (JSON lines) / .parquet file.
        eval_path: Its own eval file; None = hold out `eval_fraction` of the train file.
        max_train: At most this many train tasks; None = all.
        max_eval: At most this many eval tasks; None = all.
        system_prompt: The system message put first in every prompt.
        max_bad_fraction: Share of rows that may be broken (skipped, counted, named); 0 = a broken row is an error
            naming file and line.
        prompt_key: The column with the question text or chat messages (e.g. `question`).
        answer_key: The column with the reference answer.
        metadata_keys: Columns passed to the reward; None = every other column.
        answer_after: E.g. `####`: the reference is the text after the last marker (GSM8K style).
        max_prompt_chars: Longer prompts are skipped and counted.
        eval_fraction: Seeded held-out fraction, used only without `eval_path`.
        seed: The seed of the held-out fraction (`run.seed` by default).
    """

    train_path: str
    eval_path: str | None = None

    def config_problems(self) -> list[str]:
        problems = _file_problems("train_path", self.train_path, self.format)
        if self.eval_path is not None:
            problems += _file_problems("eval_path", self.eval_path, self.format)
        elif not 0.0 <= self.eval_fraction < 1.0:
            problems.append(f"eval_fraction={self.eval_fraction}: allowed 0 <= eval_fraction < 1")
        return problems

    def read_splits(self) -> tuple[list[Task], list[Task] | None]:
        return self._load(self.train_path), None if self.eval_path is None else self._load(self.eval_path)

    def _load(self, path: str) -> list[Task]:
        file = Path(path).expanduser()
        return rows_to_tasks(read_rows(file, self.skipped), file.name, self.format, self.skipped)


def read_rows(file: Path, skipped: SkippedRows) -> Iterator[Mapping[str, Any] | None]:
    """The rows of a JSONL or parquet file. A blank line yields None (so row numbers stay line numbers);
    a line that is not a JSON object yields None too, and is counted as skipped here."""
    if file.suffix == ".parquet":
        import pyarrow.parquet as pq

        yield from pq.read_table(file).to_pylist()
        return
    with file.open(encoding="utf-8", errors="replace") as lines:
        for line_no, line in enumerate(lines, start=1):
            if not line.strip():
                yield None
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                row = f"not JSON ({err})"
            if not isinstance(row, dict):
                skipped.add(f"{file.name}:{line_no}", row if isinstance(row, str) else "not a JSON object")
                row = None
            yield row


def first_row_columns(file: Path) -> list[str]:
    """Column names of a file, from its parquet schema or its first JSON object line."""
    if file.suffix == ".parquet":
        import pyarrow.parquet as pq

        return list(pq.read_schema(file).names)
    with file.open(encoding="utf-8", errors="replace") as lines:
        for line in lines:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict):
                return list(row)
    return []


def _file_problems(key: str, path: str, row_format: RowFormat) -> list[str]:
    file = Path(path).expanduser()
    if not file.is_file():
        return [f"{key}={path!r}: no such file"]
    if file.suffix not in SUFFIXES:
        return [f"{key}={path!r}: unknown file type {file.suffix!r}; allowed: {', '.join(SUFFIXES)}"]
    if file.suffix == ".parquet":
        import importlib.util

        if importlib.util.find_spec("pyarrow") is None:
            return [f"{key}={path!r}: reading parquet needs pyarrow: pip install 'grpo_pipe[hf]'"]
    return row_format.column_problems(first_row_columns(file), file.name)
