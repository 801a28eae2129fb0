"""Tools: plain typed Python functions with a docstring (as TRL and transformers take them), loaded from the user's
own file (`my_tools.py:lookup`), a module (`pkg.mod:fn`) or by a shipped name (`calculator`, `python`), and the
user's own environment class (its public methods are the tools, one instance per episode).

Everything that can be wrong with a tool (a file that does not import, a missing name, no type hints or docstring,
a default that is not JSON) is found here, before any model loads. What goes wrong while a tool runs (it raises,
hangs, returns a non-string, prints megabytes) never reaches the run: `calling` makes it an observation.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from grpo_pipe.types import Task

# The shipped tools by name: classes whose instances are the tool (their settings come from `tool_options`).
SHIPPED = {
    "calculator": "grpo_pipe.episodes.tools.calculator:Calculator",
    "python": "grpo_pipe.episodes.tools.python_sandbox:PythonSandbox",
}
# Methods of an environment class that are its protocol, not tools.
ENVIRONMENT_METHODS = ("reset", "reward", "close")


class ToolSpecError(ValueError):
    """A tool or environment setting that cannot work; `problems` name each one."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = list(problems)


@dataclass(frozen=True)
class Tool:
    """One tool as the model sees it (its JSON schema) and as the episode calls it."""

    name: str
    schema: dict[str, Any]  # {"type": "function", "function": {"name", "description", "parameters"}}

    @property
    def parameters(self) -> list[str]:
        return list(self.schema["function"]["parameters"].get("properties", {}))


def load_object(spec: str) -> Any:
    """`path/to/file.py:name` or `package.module:name` -> the object; ToolSpecError naming what is wrong."""
    source, _, name = spec.rpartition(":")
    if not source or not name:
        raise ToolSpecError([f"{spec!r}: expected FILE.py:NAME or MODULE:NAME"])
    try:
        module = _import_file(Path(source)) if source.endswith(".py") else importlib.import_module(source)
    except ToolSpecError:
        raise
    except Exception as err:  # the user's file: any error it raises on import is reported, with its type
        raise ToolSpecError([f"{spec!r}: {source} does not import: {type(err).__name__}: {err}"]) from err
    if not hasattr(module, name):
        public = sorted(n for n in vars(module) if not n.startswith("_"))
        raise ToolSpecError([f"{spec!r}: {source} has no {name!r}; it defines: {', '.join(public) or 'nothing public'}"])
    return getattr(module, name)


def _import_file(path: Path) -> Any:
    if not path.is_file():
        raise ToolSpecError([f"{path}: no such file (relative paths are from the directory the job runs in)"])
    module_name = f"grpo_pipe_user_tools_{abs(hash(str(path.resolve())))}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ToolSpecError([f"{path}: cannot be imported as a Python module"])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[module_name] = module
    return module


def tool_schema(fn: Callable[..., Any], name: str) -> dict[str, Any]:
    """transformers' JSON schema of a typed function with a Google-style docstring, under `name`; its defaults
    must be JSON values (the model sees them)."""
    from transformers.utils.chat_template_utils import get_json_schema

    try:
        schema = get_json_schema(fn)
    except Exception as err:  # transformers names what is missing (a type hint, the docstring, an argument's line)
        raise ToolSpecError([f"tool {name!r}: {err}"]) from err
    for parameter in inspect.signature(fn).parameters.values():
        if parameter.default is not inspect.Parameter.empty:
            try:
                json.dumps(parameter.default)
            except TypeError:
                raise ToolSpecError([f"tool {name!r}: the default of {parameter.name!r} ({parameter.default!r}) is "
                                     "not a JSON value"]) from None
    schema["function"]["name"] = name
    return schema


def function_tools(specs: Sequence[str], options: Mapping[str, Mapping[str, Any]]) -> dict[str, Callable[..., Any]]:
    """name -> callable for `environment.tools`: a shipped name, or FILE.py:NAME / MODULE:NAME of a function (or of
    a class, whose instance built with `tool_options[name]` is the tool). Every problem of every tool is raised at
    once, schemas included."""
    problems, tools = [], {}
    for spec in specs:
        if ":" not in spec and spec not in SHIPPED:
            problems.append(f"{spec!r}: not a shipped tool ({', '.join(SHIPPED)}) and not FILE.py:NAME or MODULE:NAME")
            continue
        name = spec.rpartition(":")[2]  # a shipped name is its own name
        try:
            target = load_object(SHIPPED.get(spec, spec))
            # a class's instance is the tool: its bound __call__ carries the signature and docstring of the schema
            tools[name] = cast(Any, target(**dict(options.get(name, {})))).__call__ if inspect.isclass(target) else target
        except ToolSpecError as err:
            problems += err.problems
        except TypeError as err:
            problems.append(f"tool_options.{name}: {err}")
    for name, fn in tools.items():
        try:
            tool_schema(fn, name)
        except ToolSpecError as err:
            problems += err.problems
    unknown = sorted(set(options) - set(tools))
    if unknown:
        problems.append(f"tool_options has settings for {unknown}, which are not among the tools {sorted(tools)}")
    if problems:
        raise ToolSpecError(problems)
    return tools


def environment_tools(cls: type) -> dict[str, Callable[..., Any]]:
    """name -> unbound method for the public methods of an environment class (its tools)."""
    if not inspect.isclass(cls):
        raise ToolSpecError([f"{cls!r} is not a class"])
    if not callable(getattr(cls, "reset", None)):
        raise ToolSpecError([f"{cls.__name__} has no reset(task) method: it starts an episode"])
    methods = {name: member for name, member in inspect.getmembers(cls, inspect.isfunction)
               if not name.startswith("_") and name not in ENVIRONMENT_METHODS}
    if not methods:
        raise ToolSpecError([f"{cls.__name__} has no public method besides {ENVIRONMENT_METHODS}: no tools"])
    return methods


def method_schema(method: Callable[..., Any], name: str) -> dict[str, Any]:
    """The schema of an environment method, its `self` left out."""

    @functools.wraps(method)
    def unbound(*args: Any, **kwargs: Any) -> Any:  # pragma: no cover - a signature carrier, never called
        return method(*args, **kwargs)

    signature = inspect.signature(method)
    unbound.__signature__ = signature.replace(parameters=list(signature.parameters.values())[1:])  # type: ignore[attr-defined]
    hints = dict(getattr(method, "__annotations__", {}))
    unbound.__annotations__ = {k: v for k, v in hints.items() if k != "self"}
    return tool_schema(unbound, name)


class EpisodeTools:
    """The tools one episode calls: shared functions, or the methods of the episode's own environment instance."""

    def __init__(self, tools: Mapping[str, Callable[..., Any]], instance: Any = None) -> None:
        self.tools = dict(tools)
        self.instance = instance  # the environment object of this episode (None for plain functions)
        # What `reset(task)` returned: the prompt was rendered from the task before the episode started, so the model
        # never sees it (TRL appends a returned string to the prompt); the runner warns once when it is not None.
        self.reset_reply: Any = None

    @property
    def done(self) -> bool:
        """Whether the environment ended the episode (its `done` attribute)."""
        return bool(getattr(self.instance, "done", False)) if self.instance is not None else False

    def reward(self) -> float | None:
        """The environment's own reward for the episode, when it defines `reward()`."""
        method = getattr(self.instance, "reward", None)
        return None if method is None else float(method())

    def close(self) -> None:
        method = getattr(self.instance, "close", None)
        if callable(method):
            method()


def start_environment(cls: type, methods: Mapping[str, Callable[..., Any]], task: Task) -> EpisodeTools:
    """A fresh environment instance for one episode, reset with its task; its tools bound to it."""
    instance = cls()
    tools = EpisodeTools({name: getattr(instance, name) for name in methods}, instance)
    tools.reset_reply = instance.reset(task)
    return tools
