"""`reward=python`: a plain function as the reward, with TRL's reward-function signature.

    def score(completions, prompts, answer, **metadata) -> list[float | None]

Every argument is a list with one entry per completion (a group's prompt, answer and metadata repeated
for each of its completions): `completions` the generated texts (as TRL, message lists where the prompt is
chat messages: `[{"role": "assistant", "content": text}]`, an episode's every turn in order; `completions=text` or
`messages` fixes the shape), `prompts` the question text (or its chat messages), `answer` the reference answers
(also as `answers`), then one keyword per metadata column
of the data under its own name (e.g. `difficulty=[...]`, as TRL passes dataset columns) and
`completion_ids` (token ids). A function receives only the arguments it names, or all of them if it takes
`**kwargs`. `None` means "does not apply" and counts as `none_value`; NaN and infinities are errors.

Before the engine starts, the function is called once on a few rows of the data with a placeholder
completion (`try_on`), so a wrong signature, an exception or a non-finite value fails in seconds.

`fn` is `package.module:function`, or `path/to/file.py:function`; modules are imported with the current
directory on the path, as `python -m` does.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
import numbers
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, cast

import torch

from grpo_pipe.types import Completion, RequestTelemetry, RewardOutput, RolloutGroup, Task

RewardFn = Callable[..., Sequence[float | None]]
CompletionShape = Literal["auto", "text", "messages"]
PLACEHOLDER = "The answer is 0."  # the completion a function is tried on before the engine starts


class PythonFunctionReward:
    """Calls `fn` once per step on every completion; its values are the reward.

    Your own reward: a plain function with TRL's reward-function signature,
    `def score(completions, prompts, answer, **metadata) -> list[float | None]`, one entry per completion; every
    data column arrives under its own name. Tried on a few data rows before any model loads.

    Args:
        fn: `package.module:function` or `path/to/file.py:function`.
        name: Logged as `train/reward/<name>`; None = the function's name.
        none_value: The reward of a completion the function returned None for (does not apply).
        success_at: A value >= this counts as solved (eval/accuracy, pass@k); None = no notion of success.
        completions: `auto` (message lists where the prompt is chat messages, as TRL; else text), `text` or
            `messages`.
    """

    def __init__(self, *, fn: str, name: str | None = None, none_value: float = 0.0, success_at: float | None = 1.0,
                 completions: CompletionShape = "auto") -> None:
        self.completions: CompletionShape = completions
        self.fn = fn
        self.name = name or fn.rsplit(":", 1)[-1]  # the term it is logged under: train/reward/<name>
        self.none_value = none_value
        self.success_at = success_at  # a value >= this counts as solved (eval accuracy, pass@k); null = never
        self._function: RewardFn | None = None

    def config_problems(self) -> list[str]:
        if self.completions not in ("auto", "text", "messages"):
            return [f"completions={self.completions!r}: allowed: auto (messages where the prompt is chat messages, "
                    "as TRL), text, messages"]
        try:
            self.function()
        except Exception as err:  # noqa: BLE001 - whatever importing the user's module raised is a config problem
            allowed = "allowed: 'package.module:function' or 'path/to/file.py:function'"
            return [f"fn={self.fn!r}: cannot be imported ({type(err).__name__}: {err}); {allowed}"]
        return []

    def function(self) -> RewardFn:
        if self._function is None:
            self._function = load_function(self.fn)
        return self._function

    def setup(self, model_path: Path, kv_dtype: torch.dtype) -> None:
        self.function()

    def source_files(self) -> list[Path]:
        """The file the function was loaded from (logged with the run)."""
        found = inspect.getsourcefile(self.function())
        return [Path(found)] if found else []

    def try_on(self, tasks: Sequence[Task]) -> list[str]:
        """Problems found by calling the function on `tasks` with a placeholder completion (empty when fine)."""
        telemetry = RequestTelemetry(prompt_tokens=0, generated_tokens=0, cached_prompt_tokens=0)
        placeholder = Completion(token_ids=(0,), logprobs=(0.0,), text=PLACEHOLDER, finish_reason="stop", policy_version=0,
                                 telemetry=telemetry)
        groups = [RolloutGroup(task, (0,), (placeholder,)) for task in tasks]
        columns = sorted(reward_columns(groups, self.completions))
        missing = sorted(_named_parameters(self.function()) - set(columns))
        if missing:
            return [f"fn={self.fn!r} takes {', '.join(missing)}, which the data does not give; it can take: "
                    f"{', '.join(columns)} (or **kwargs)"]
        try:
            call_reward_function(self.function(), groups, self.fn, self.completions)
        except RewardFunctionError as err:  # what it raised or returned, with the task
            return [f"fn={self.fn!r}: called on {len(groups)} rows of the data with the completion {PLACEHOLDER!r}: {err}"]
        return []

    def __call__(self, groups: Sequence[RolloutGroup]) -> RewardOutput:
        raw = call_reward_function(self.function(), groups, self.fn, self.completions)
        values = [self.none_value if v is None else float(v) for v in raw]  # [N]
        correct = None if self.success_at is None else [v is not None and v >= self.success_at for v in raw]
        terms = {self.name: values, f"{self.name}/applies": [0.0 if v is None else 1.0 for v in raw]}
        return RewardOutput(values=values, terms=terms, correct=correct)


class RewardFunctionError(RuntimeError):
    """The user's reward function failed or returned what a reward cannot be; the message names the function, the
    task and completion where it applies, and what is allowed."""


def call_reward_function(function: RewardFn, groups: Sequence[RolloutGroup], label: str,
                         completions: CompletionShape = "auto") -> list[float | None]:
    """Call `function` TRL-style on every completion of `groups`; check what it returns."""
    columns = reward_columns(groups, completions)
    count = len(columns["completions"])
    if not _takes_any_keyword(function):
        names = set(inspect.signature(function).parameters)
        columns = {k: v for k, v in columns.items() if k in names}
    try:
        result = list(function(**columns))
    except Exception as err:
        raise RewardFunctionError(f"reward function {label} raised {type(err).__name__}: {err}") from err
    if len(result) != count:
        raise RewardFunctionError(f"reward function {label} returned {len(result)} values for {count} completions")
    for index, value in enumerate(result):
        if value is not None and (not isinstance(value, numbers.Real) or not math.isfinite(float(value))):
            task, text = _where(groups, index)
            raise RewardFunctionError(f"reward function {label} returned {value!r} for task {task} (completion "
                                      f"{text[:80]!r}); allowed: a finite number or None (None: does not apply)")
    return [None if v is None else float(v) for v in result]


def _where(groups: Sequence[RolloutGroup], index: int) -> tuple[str, str]:
    """The task uid and completion text of the `index`-th completion of `groups`."""
    for group in groups:
        if index < len(group.completions):
            return group.task.uid, group.completions[index].text
        index -= len(group.completions)
    return "?", ""


def _named_parameters(function: RewardFn) -> set[str]:
    """The keyword parameters the function needs filled (those without a default)."""
    return {p.name for p in inspect.signature(function).parameters.values()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.default is p.empty}


def _takes_any_keyword(function: RewardFn) -> bool:
    return any(p.kind is p.VAR_KEYWORD for p in inspect.signature(function).parameters.values())


def reward_columns(groups: Sequence[RolloutGroup], completions: CompletionShape = "auto") -> dict[str, list[Any]]:
    """The keyword arguments of a TRL-style reward function, one entry per completion."""
    columns: dict[str, list[Any]] = {"completions": [], "prompts": [], "answer": [], "answers": [], "completion_ids": []}
    metadata_keys = sorted({k for g in groups for k in g.task.metadata})
    for key in metadata_keys:
        columns.setdefault(key, [])
    for group in groups:
        task = group.task
        prompt: Any = [dict(m) for m in task.messages] if task.messages is not None else task.question
        as_messages = completions == "messages" or (completions == "auto" and task.messages is not None)
        for completion in group.completions:
            columns["completions"].append(completion_messages(completion) if as_messages else completion.text)
            columns["prompts"].append(prompt)
            columns["answer"].append(task.answer)  # TRL's name for the column
            columns["answers"].append(task.answer)
            columns["completion_ids"].append(list(completion.token_ids))
            for key in metadata_keys:
                columns[key].append(task.metadata.get(key))
    return columns


def completion_messages(completion: Completion) -> list[dict[str, str]]:
    """A completion in TRL's conversational shape: one assistant message, or an episode's turns in order."""
    if completion.episode is None or not completion.episode.turns:
        return [{"role": "assistant", "content": completion.text}]
    return [{"role": turn.role, "content": turn.text, **({"name": turn.tool} if turn.role == "tool" and turn.tool else {})}
            for turn in completion.episode.turns]


def load_function(spec: str) -> RewardFn:
    """`package.module:function` or `path/to/file.py:function` -> the function."""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise ValueError("expected '<module or file.py>:<function>'")  # config_problems names it with the setting
    if module_name.endswith(".py"):
        module = _module_from_file(Path(module_name).expanduser())
    else:
        if "" not in sys.path and str(Path.cwd()) not in sys.path:
            sys.path.insert(0, str(Path.cwd()))  # user modules beside the command, as `python -m` finds them
        module = importlib.import_module(module_name)
    function = getattr(module, attr)
    if not callable(function):
        raise TypeError(f"{attr} in {module_name} is not callable")
    return cast(RewardFn, function)


def _module_from_file(path: Path) -> Any:
    if not path.is_file():
        raise OSError(f"no such file {path}")
    spec = importlib.util.spec_from_file_location(f"grpo_pipe_user_reward_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
