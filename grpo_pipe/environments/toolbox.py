"""Tools: plain typed Python functions with a docstring (as TRL and transformers take them), loaded from the user's
own file (`my_tools.py:lookup`), a module (`pkg.mod:fn`) or by a shipped name (`calculator`, `python`), and the
user's own environment class (its public methods are the tools, one instance per episode).

Everything that can be wrong with a tool (a file that does not import, a missing name, no type hints or docstring,
a default that is not JSON, a setting in `tool_options` that its class refuses) is found here, before any model
loads. What goes wrong while a tool runs (it raises, hangs, returns a non-string, prints megabytes) never reaches the
run: `calling` makes it an observation.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import json
import pkgutil
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from grpo_pipe.config.validate import settings_problems
from grpo_pipe.interfaces import ChecksItsConfig
from grpo_pipe.types import Task

# The shipped tools' package: its module `NAME` that defines `TOOL` ships the tool `NAME` (see `shipped_tools`).
TOOLS_PACKAGE = "grpo_pipe.environments.tools"
# Methods of an environment class that are its protocol, not tools.
ENVIRONMENT_METHODS = ("reset", "reward", "close")


class ToolSpecError(ValueError):
    """A tool or environment setting that cannot work; `problems` name each one.

    Args:
        problems: Each setting that cannot work, and why.
    """

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = list(problems)


@dataclass(frozen=True)
class Tool:
    """One tool as the model sees it (its JSON schema) and as the episode calls it.

    Args:
        name: The name the model calls it by.
        schema: Its JSON schema: `{"type": "function", "function": {"name", "description", "parameters"}}`.
    """

    name: str
    schema: dict[str, Any]

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


def shipped_tools() -> dict[str, type]:
    """The shipped tools by name: every public module of `grpo_pipe.environments.tools` that defines `TOOL` (the class
    whose instance is the tool) ships the tool of its own name (`tools/calculator.py` -> `calculator`). A new shipped
    tool is one module there; nothing lists it. Private modules (`_sandbox_child.py`) are not imported."""
    package = importlib.import_module(TOOLS_PACKAGE)
    modules = (importlib.import_module(f"{TOOLS_PACKAGE}.{m.name}") for m in pkgutil.iter_modules(package.__path__)
               if not m.name.startswith("_"))
    return {module.__name__.rpartition(".")[2]: module.TOOL for module in modules
            if inspect.isclass(getattr(module, "TOOL", None))}


def function_tools(specs: Sequence[str], options: Mapping[str, Mapping[str, Any]]) -> dict[str, Callable[..., Any]]:
    """name -> callable for `environment.tools`: a shipped name, or FILE.py:NAME / MODULE:NAME of a function (or of
    a class, whose instance built with `tool_options[name]` is the tool). Every problem of every tool is raised at
    once, schemas and settings included, each under its key: `tools: ...`, `tool_options.<name>.<key>=...: ...`."""
    problems, tools = [], {}
    shipped = shipped_tools()
    for spec in specs:
        if ":" not in spec and spec not in shipped:
            problems.append(f"tools: {spec!r}: not a shipped tool ({', '.join(sorted(shipped))}) and not FILE.py:NAME "
                            "or MODULE:NAME")
            continue
        name = spec.rpartition(":")[2]  # a shipped name is its own name
        try:
            target = shipped[spec] if spec in shipped else load_object(spec)
        except ToolSpecError as err:
            problems += [f"tools: {p}" for p in err.problems]
            continue
        tool, found = _built_tool(name, target, dict(options.get(name, {})))
        problems += found
        if tool is not None:
            tools[name] = tool
    for name, fn in tools.items():
        try:
            tool_schema(fn, name)
        except ToolSpecError as err:
            problems += [f"tools: {p}" for p in err.problems]
    named = {spec.rpartition(":")[2] for spec in specs}
    problems += [f"tool_options.{name}: settings for a tool that is not among the tools ({', '.join(sorted(named))})"
                 for name in sorted(set(options) - named)]
    if problems:
        raise ToolSpecError(problems)
    return tools


def _built_tool(name: str, target: Any, settings: dict[str, Any]) -> tuple[Callable[..., Any] | None, list[str]]:
    """The tool `target` makes with `tool_options.<name>`, or None and everything wrong with those settings (keys and
    types against its constructor, then its own `config_problems()`), each under `tool_options.<name>`. A class's
    instance is the tool: its bound `__call__` carries the signature and docstring of the schema; a function is its
    own tool and takes no settings."""
    key = f"tool_options.{name}"
    if not inspect.isclass(target):
        if settings:
            return None, [f"{key}: {name} is a function, which takes no settings (a class's instance is a tool with "
                          "settings)"]
        return target, []
    problems = settings_problems(key, target, settings)
    if problems:
        return None, problems  # the constructor and the rules would judge values of the wrong type
    try:
        tool = target(**settings)
    except (TypeError, ValueError) as err:  # the user's class: a constructor that judges its own settings
        return None, [f"{key}: {type(err).__name__}: {err}"]
    own = tool.config_problems() if isinstance(tool, ChecksItsConfig) else []
    return (None, [f"{key}.{problem}" for problem in own]) if own else (cast(Any, tool).__call__, [])


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
    """The tools one episode calls: shared functions, or the methods of the episode's own environment instance.

    Args:
        tools: The callables by the name the model calls them.
        instance: The environment object of this episode; None for plain functions.
    """

    def __init__(self, tools: Mapping[str, Callable[..., Any]], instance: Any = None) -> None:
        self.tools = dict(tools)
        self.instance = instance
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
