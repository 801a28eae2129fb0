"""Validate the composed config against the components it will build, before anything heavy runs.

The schema is the code itself: every node with a `_target_` is checked against the signature and
type hints of the class it names (unknown keys, missing required values, wrong types, values
outside a `Literal`). All problems are collected and raised together, each naming the key, the
value and what is allowed. Checking is cheap: it imports the component modules, never vLLM.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

from hydra.utils import get_object
from omegaconf import DictConfig, ListConfig, OmegaConf

HYDRA_KEYS = {"_target_", "_partial_", "_recursive_", "_convert_", "_args_"}


class ConfigError(ValueError):
    """One or more invalid config values; the message lists every problem found."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("Invalid config:\n" + "\n".join(f"  - {p}" for p in self.problems))


def validate_config(cfg: DictConfig, groups: Sequence[str], plain_keys: Sequence[str] = ()) -> None:
    """Check every group node of `cfg` (and nested component nodes). Raises ConfigError.

    `plain_keys` are top-level settings that are not components (e.g. `resume`)."""
    problems: list[str] = []
    for key in cfg:
        if key not in groups and key not in plain_keys and key != "hydra":
            allowed = ", ".join(sorted([*groups, *plain_keys]))
            problems.append(f"{key}: unknown top-level key; allowed: {allowed}")
    for group in groups:
        node = cfg.get(group)
        if not isinstance(node, DictConfig) or "_target_" not in node:
            problems.append(f"{group}: expected a component config with a `_target_`, got {_show(node)}")
            continue
        _check_component(group, node, problems)
    if problems:
        raise ConfigError(problems)


def _check_component(path: str, node: DictConfig, problems: list[str]) -> None:
    target = node["_target_"]
    try:
        factory = get_object(target)
    except Exception as err:
        problems.append(f"{path}._target_={target!r} cannot be imported ({err})")
        return
    signature = inspect.signature(factory)
    try:
        hints = typing.get_type_hints(factory.__init__ if inspect.isclass(factory) else factory)
    except Exception:  # unresolvable annotations: check names only
        hints = {}
    params = {n: p for n, p in signature.parameters.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    takes_any = any(p.kind == p.VAR_KEYWORD for p in signature.parameters.values())
    for key in node:
        if key in HYDRA_KEYS:
            continue
        if key not in params:
            if not takes_any:
                allowed = ", ".join(sorted(params)) or "(none)"
                problems.append(f"{path}.{key}: unknown setting for {_short(target)}; allowed: {allowed}")
            continue
        value = _value(node, key, path, problems)
        if value is not _MISSING and key in hints:
            _check_value(f"{path}.{key}", value, hints[key], problems)
    for name, param in params.items():
        if param.default is inspect.Parameter.empty and name not in node and not node.get("_partial_", False):
            problems.append(f"{path}.{name}: required by {_short(target)} but not set")


_MISSING = object()


def _value(node: DictConfig, key: str, path: str, problems: list[str]) -> Any:
    if OmegaConf.is_missing(node, key):
        problems.append(f"{path}.{key}: required value `???` was not set")
        return _MISSING
    try:
        return node[key]
    except Exception as err:  # a broken interpolation
        problems.append(f"{path}.{key}: cannot be resolved ({err})")
        return _MISSING


def _check_value(path: str, value: Any, hint: Any, problems: list[str]) -> None:
    if isinstance(value, DictConfig) and "_target_" in value:
        _check_component(path, value, problems)
        return
    error = _type_error(value, hint)
    if error:
        problems.append(f"{path}={_show(value)}: {error}")


def _type_error(value: Any, hint: Any) -> str | None:
    """None if `value` fits `hint`, else what was expected."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint is Any or hint is inspect.Parameter.empty:
        return None
    if origin is typing.Literal:
        return None if value in args else "allowed values: " + ", ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        errors = [_type_error(value, arg) for arg in args]
        if any(e is None for e in errors):
            return None
        literal_options = [e for e in errors if e and e.startswith("allowed values")]
        return literal_options[0] if literal_options else "expected " + " or ".join(_name(a) for a in args)
    if hint is type(None):
        return None if value is None else "expected null"
    if hint is bool:
        return None if isinstance(value, bool) else "expected true or false"
    if hint is int:
        return None if isinstance(value, int) and not isinstance(value, bool) else "expected an integer"
    if hint is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return None if ok else "expected a number"
    if hint is str:
        return None if isinstance(value, str) else "expected a string"
    container = origin or hint
    if container in (list, tuple, Sequence, typing.Sequence):
        if not isinstance(value, (ListConfig, list, tuple)):
            return f"expected a list ({_name(hint)})"
        return _items_error(value, args, fixed=container is tuple and bool(args) and args[-1] is not Ellipsis)
    if container in (dict, Mapping, typing.Mapping) or (isinstance(container, type) and issubclass(container, Mapping)):
        return None if isinstance(value, (DictConfig, dict)) else "expected a mapping"
    if isinstance(hint, type) and (value is None or isinstance(value, (DictConfig, dict))):
        # A nested component (e.g. a reward held by another reward): null would only fail once built.
        return f"expected a component config with `_target_` building {hint.__name__}"
    return None  # protocols and other classes are checked when the object is built


def _items_error(items: Sequence[Any], args: tuple[Any, ...], fixed: bool) -> str | None:
    if not args:
        return None
    if fixed and len(items) != len(args):
        return f"expected a list of {len(args)} items"
    item_hints = args if fixed else [args[0]] * len(items)
    for index, (item, item_hint) in enumerate(zip(items, item_hints)):
        error = _type_error(item, item_hint)
        if error:
            return f"item {index}: {error}"
    return None


def _name(hint: Any) -> str:
    if hint is type(None):
        return "null"
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def _short(target: str) -> str:
    return target.rsplit(".", 1)[-1]


def _show(value: Any) -> str:
    if isinstance(value, (DictConfig, ListConfig)):
        return repr(OmegaConf.to_container(value, resolve=False))
    return repr(value)
