"""The job's loaded data, before any model loads: what only the rows can tell (`check_data_and_reward`: broken rows,
an empty or short split, a reward or curriculum that cannot take these tasks), and the data's fingerprint logged with
the tracked run (`data_fingerprint`). The config's own rules are checked earlier, by `runner.components.build`.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence

from grpo_pipe.config.errors import InputError
from grpo_pipe.data.rows import bad_rows_problem
from grpo_pipe.interfaces import ChecksTasks, TriesOnTasks
from grpo_pipe.runner.components import Components
from grpo_pipe.types import Task

log = logging.getLogger(__name__)


def check_data_and_reward(parts: Components, train: Sequence[Task], held_out: Sequence[Task]) -> None:
    """What only the loaded data can tell: too many broken rows, a held-out split smaller than asked for, a user's
    reward function that fails on real rows (tried on four, with a placeholder completion), and train tasks a
    curriculum cannot place."""
    problems = [] if train else ["data: the train split is empty (check data.* settings and the skipped-row warnings)"]
    bad = bad_rows_problem(list(parts.data.skipped), len(train) + len(held_out), parts.data.max_bad_fraction)
    if bad:
        problems.append(bad)
    if isinstance(parts.reward, TriesOnTasks):
        problems += [f"reward.{problem}" for problem in parts.reward.try_on(train[:4])]
    if isinstance(parts.curriculum, ChecksTasks):
        problems += [f"curriculum.{problem}" for problem in parts.curriculum.task_problems(train)]
    if problems:
        raise InputError(problems)
    if len(held_out) < parts.run.eval_size:
        log.warning("The held-out split has %d tasks, fewer than run.eval_size=%d: evaluations use %d",
                    len(held_out), parts.run.eval_size, len(held_out))


def data_fingerprint(train: Sequence[Task], held_out: Sequence[Task]) -> dict[str, str]:
    """Rows and a sha256 of the tasks as the job saw them (uid, prompt, answer), so two runs can be told to have
    trained on the same data even when the file behind a path changed."""
    digest = hashlib.sha256()
    for task in (*train, *held_out):
        digest.update(json.dumps([task.uid, task.question, task.answer, task.messages], default=str).encode())
    return {"data_fingerprint.train_rows": str(len(train)), "data_fingerprint.eval_rows": str(len(held_out)),
            "data_fingerprint.sha256": digest.hexdigest()}
