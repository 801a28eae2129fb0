"""`data=hf`: a Hugging Face dataset, from the hub (online) or a local folder (offline).

A local folder is either a dataset saved with `save_to_disk` (read with `datasets.load_from_disk`) or a
folder of JSONL / parquet files, whose split names come from the file names (`train.jsonl`, `test.parquet`).
Columns map as in `data=jsonl`; eval is a named split, or a seeded held-out fraction of the train split.
Needs the optional `datasets` package: `pip install 'grpo_pipe[hf]'`.
"""

from __future__ import annotations

import importlib.util
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_pipe.data.rows import RowTaskSource, rows_to_tasks
from grpo_pipe.types import Task

log = logging.getLogger(__name__)

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_SAVED_MARKERS = ("dataset_dict.json", "state.json")  # what `save_to_disk` writes


@dataclass(kw_only=True, eq=False)
class HfDatasetTasks(RowTaskSource):
    """Tasks from the splits of one Hugging Face dataset.

    A hub id (online) or a local folder (offline): a `save_to_disk` folder, or a folder of JSONL / parquet files whose
    names give the splits. Needs `grpo_pipe[hf]`. Columns map as in `JsonlTasks`.

    Args:
        name: A hub id `org/name` or a local folder.
        config_name: The hub dataset's configuration (e.g. `main` for openai/gsm8k).
        revision: The hub dataset's branch, tag or commit.
        train_split: The split trained on.
        eval_split: The held-out split; None = hold out `eval_fraction` of the train split.
        max_train: At most this many train tasks; None = all.
        max_eval: At most this many eval tasks; None = all.
        system_prompt: The system message put first in every prompt.
        max_bad_fraction: Share of rows that may be broken (skipped, counted, named); 0 = a broken row is an error
            naming file and line.
        prompt_key: The column with the question text or chat messages.
        answer_key: The column with the reference answer.
        metadata_keys: Columns passed to the reward; None = every other column.
        answer_after: E.g. `####` for openai/gsm8k: the reference is the text after the last marker.
        max_prompt_chars: Longer prompts are skipped and counted.
        eval_fraction: Seeded held-out fraction, used only without `eval_split`.
        seed: The seed of the held-out fraction (`run.seed` by default).
    """

    name: str  # a hub id "org/name" or a local folder
    config_name: str | None = None
    revision: str | None = None
    train_split: str = "train"
    eval_split: str | None = "test"  # null: hold out eval_fraction of the train split
    _dataset: Any = field(init=False, repr=False, default=None)

    def config_problems(self) -> list[str]:
        if importlib.util.find_spec("datasets") is None:
            return ["_target_: data=hf needs the `datasets` package: pip install 'grpo_pipe[hf]'"]
        folder = Path(self.name).expanduser()
        if not folder.is_dir():
            if self.name.startswith((".", "/", "~")) or not _HUB_ID.match(self.name):
                return [f"name={self.name!r}: no such folder (allowed: a local dataset folder or a hub id 'org/name')"]
            return []  # a hub dataset: its splits and columns are checked when it is downloaded
        if not 0.0 <= self.eval_fraction < 1.0:
            return [f"eval_fraction={self.eval_fraction}: allowed 0 <= eval_fraction < 1"]
        return self._split_problems(self._load())

    def _split_problems(self, dataset: Any) -> list[str]:
        problems: list[str] = []
        for key, split in (("train_split", self.train_split), ("eval_split", self.eval_split)):
            if split is None:
                continue
            if split not in dataset:
                problems.append(f"{key}={split!r}: no such split in {self.name}; splits: {', '.join(dataset)}")
            else:
                problems += self.format.column_problems(dataset[split].column_names, f"{self.name} [{split}]")
        return problems

    def read_splits(self) -> tuple[list[Task], list[Task] | None]:
        dataset = self._load()
        problems = self._split_problems(dataset)
        if problems:  # a hub dataset, seen for the first time now
            from grpo_pipe.config.errors import InputError

            raise InputError([f"data.{p}" for p in problems])
        train = self._tasks(dataset, self.train_split)
        return train, None if self.eval_split is None else self._tasks(dataset, self.eval_split)

    def _tasks(self, dataset: Any, split: str) -> list[Task]:
        return rows_to_tasks(iter(dataset[split]), f"{Path(self.name).name}/{split}", self.format, self.skipped)

    def _load(self) -> Any:
        """A DatasetDict (a single saved Dataset becomes the `train` split)."""
        if self._dataset is None:
            import datasets

            folder = Path(self.name).expanduser()
            if folder.is_dir() and any((folder / m).exists() for m in _SAVED_MARKERS):
                loaded = datasets.load_from_disk(str(folder))
            elif folder.is_dir():
                loaded = datasets.load_dataset(str(folder))
            else:
                loaded = datasets.load_dataset(self.name, self.config_name, revision=self.revision)
            self._dataset = datasets.DatasetDict({"train": loaded}) if isinstance(loaded, datasets.Dataset) else loaded
        return self._dataset
