"""Validate the composed config against the components it will build, before anything heavy runs.

Three passes, all before any model or engine loads, every problem in the one "Invalid config" list:
1. Types: every node with a `_target_` is checked against the signature and type hints of the class
   it names (unknown keys, missing required values, wrong types, values outside a `Literal`).
2. Cross-field rules no single constructor can see (`cross_field_problems`): the generation budget
   against the engine's context, data files that must exist.
3. Construction (`instantiate_components`): each constructor checks its own ranges; what they raise
   is collected per group instead of surfacing as one Hydra traceback.
Checking is cheap: it imports the component modules, never vLLM.
"""

from __future__ import annotations

import inspect
import logging
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from hydra.errors import InstantiationException
from hydra.utils import get_object, instantiate
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from grpo_pipe.config.errors import ConfigError

__all__ = ["cross_field_problems", "instantiate_components", "settings_problems", "validate_config"]

log = logging.getLogger(__name__)
HYDRA_KEYS = {"_target_", "_partial_", "_recursive_", "_convert_", "_args_"}


def validate_config(cfg: DictConfig, groups: Sequence[str], plain_keys: Sequence[str] = ()) -> None:
    """Check every group node of `cfg` (and nested component nodes). Raises ConfigError.

    `plain_keys` are top-level settings that are not components (e.g. `resume`)."""
    problems: list[str] = []
    for key in cfg:
        if key not in groups and key not in plain_keys and key != "hydra":
            allowed = ", ".join(sorted([*groups, *plain_keys]))
            problems.append(f"{key}: unknown top-level key; allowed: {allowed}")
    well_typed = []  # groups whose values all have the right types: their constructors may judge their ranges
    for group in groups:
        node = cfg.get(group)
        if not isinstance(node, DictConfig) or "_target_" not in node:
            problems.append(f"{group}: expected a component config with a `_target_`, got {_show(node)}")
            continue
        found = len(problems)
        _check_component(group, node, problems)
        if len(problems) == found:
            well_typed.append(group)
    problems.extend(_cross_field_problems_read_safely(cfg))  # each rule reads its values defensively
    if problems:  # report the constructors' own range checks with them, not on the next try
        problems.extend(_each_constructor_alone(cfg, well_typed, groups))
        raise ConfigError(list(dict.fromkeys(problems)))


def _cross_field_problems_read_safely(cfg: DictConfig) -> list[str]:
    """The cross-field rules beside the type problems; a value that does not even resolve is already named."""
    try:
        return cross_field_problems(cfg)
    except OmegaConfBaseException:
        return []


def cross_field_problems(cfg: DictConfig) -> list[str]:
    """Rules that involve more than one component's settings, or the file system."""
    problems: list[str] = []
    context = OmegaConf.select(cfg, "rollout.max_model_len")
    for key in ("run.max_new_tokens", "run.eval_max_new_tokens"):
        budget = OmegaConf.select(cfg, key)
        if isinstance(context, int) and isinstance(budget, int) and budget >= context:
            problems.append(
                f"{key}={budget} leaves no room for a prompt in rollout.max_model_len={context}: "
                f"allowed {key} <= {context - 1} (prompt + completion must fit), or raise rollout.max_model_len"
            )
        if isinstance(budget, int) and budget < 1:
            problems.append(f"{key}={budget}: must be >= 1")
    episode = OmegaConf.select(cfg, "environment.max_episode_tokens")
    if isinstance(context, int) and isinstance(episode, int) and episode >= context:
        problems.append(f"environment.max_episode_tokens={episode} leaves no room for a prompt in rollout.max_model_len="
                        f"{context}: allowed environment.max_episode_tokens <= {context - 1}, or raise rollout.max_model_len")
    positions = OmegaConf.select(cfg, "model.max_position_embeddings")
    if isinstance(context, int) and isinstance(positions, int) and context > positions:
        problems.append(f"rollout.max_model_len={context} > model.max_position_embeddings={positions}: "
                        f"allowed rollout.max_model_len <= {positions}, or raise model.max_position_embeddings")
    grace = OmegaConf.select(cfg, "run.shutdown_grace_s")
    if isinstance(grace, (int, float)) and grace <= 0:
        problems.append(f"run.shutdown_grace_s={grace}: must be > 0 (seconds a stop may take before the process ends)")
    problems.extend(_data_file_problems(cfg))
    return problems


def _data_file_problems(cfg: DictConfig) -> list[str]:
    """`data.path` (a folder) and the `data.*_file` names inside it must exist, if a path is set."""
    data = cfg.get("data")
    if not isinstance(data, DictConfig) or data.get("path") is None:
        return []
    folder = Path(str(data.path))
    if not folder.is_dir():
        return [f"data.path={str(folder)!r}: no such folder"]
    problems = []
    for key in sorted(k for k in data if isinstance(k, str) and k.endswith("_file")):
        name = data.get(key)
        if name is not None and not (folder / str(name)).is_file():
            present = ", ".join(sorted(p.name for p in folder.iterdir() if p.is_file())[:10]) or "(no files)"
            problems.append(f"data.{key}={str(name)!r}: no such file in data.path={str(folder)!r}; found: {present}")
    return problems


def instantiate_components(cfg: DictConfig, groups: Sequence[str], nested: Sequence[str] = ()) -> dict[str, Any]:
    """Build each group's component; every constructor's complaint is collected into one ConfigError.

    `nested`: groups built inside another (`trainer.loss: ${loss}`). A nested constructor that fails
    stops its parent's constructor from running, so on failure every node is built once more on its
    own, non-recursively, to collect the parent's range checks too."""
    parts: dict[str, Any] = {}
    problems: list[str] = []
    for group in groups:
        log.info("Instantiating %s <%s>", group, cfg[group]._target_)
        try:
            parts[group] = instantiate(cfg[group], _convert_="all")
        except (InstantiationException, ValueError, TypeError) as err:
            problems.extend(_constructor_problems(group, err))
    if problems:
        problems.extend(_each_constructor_alone(cfg, (*groups, *nested), (*groups, *nested)))
        raise ConfigError(list(dict.fromkeys(problems)))
    return parts


def component_problems(group: str, part: object, groups: Sequence[str]) -> list[str]:
    """A built component's own rules (`config_problems`), each under the group's key. A problem that names a key
    in full (of its own group, or of a group built inside it: the trainer's `loss.`) keeps it."""
    if not callable(getattr(part, "config_problems", None)):
        return []
    found: list[str] = part.config_problems()  # type: ignore[attr-defined]
    return [p if p.split(".", 1)[0] in (group, *groups) and "." in p else f"{group}.{p}" for p in found]


def _each_constructor_alone(cfg: DictConfig, built: Sequence[str], groups: Sequence[str] = ()) -> list[str]:
    """Every group built on its own (the components it shares with other groups left as config), and its own rules:
    reported with the type and cross-field problems, not on the next try."""
    problems: list[str] = []
    for group in built:
        try:
            alone = instantiate(_own_part(cfg, group), _convert_="all")
            problems.extend(component_problems(group, alone, groups))
        except (InstantiationException, ValueError) as err:
            problems.extend(_constructor_problems(group, err))
        except Exception as err:  # noqa: BLE001 a component that needs its nested objects built: checked when built
            log.debug("%s: not checked on its own (%s)", group, err)
    return problems


def _own_part(cfg: DictConfig, group: str) -> DictConfig:
    """A copy of `group`'s node in which the components it shares with other groups (`trainer.loss: ${loss}`) are plain
    settings: built, it makes its own settings groups (`trainer.optimisation`) and nothing judged elsewhere, so one
    failing component does not hide another's rules."""
    root = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))  # the copy's interpolations still resolve
    node: DictConfig = cast(DictConfig, root)[group]  # a component's node: checked as one before it is built
    _shared_as_settings(node)
    return node


def _shared_as_settings(node: DictConfig) -> None:
    for key in [str(k) for k in node.keys()]:
        value = node[key]
        if not isinstance(value, DictConfig):
            continue
        if not OmegaConf.is_interpolation(node, key):
            _shared_as_settings(value)
        elif "_target_" in value:
            settings = cast(dict[str, Any], OmegaConf.to_container(value, resolve=True))
            node[key] = {k: v for k, v in settings.items() if k not in HYDRA_KEYS}


def _constructor_problems(group: str, err: BaseException) -> list[str]:
    """The constructor's own message (Hydra wraps it in `Error in call to target ...`)."""
    cause: BaseException = err
    while isinstance(cause, InstantiationException) and cause.__cause__ is not None:
        cause = cause.__cause__
    if isinstance(cause, ConfigError):
        return cause.problems
    message = str(cause).strip()
    return [message if message.split("=", 1)[0].split(".", 1)[0] == group else f"{group}: {message}"]


def settings_problems(path: str, factory: Any, settings: Mapping[str, Any]) -> list[str]:
    """What is wrong with plain `settings` for `factory` (a class or function), each under `path`: unknown keys, required
    ones missing, values of the wrong type. For components configured outside a `_target_` node (a tool's options)."""
    params, hints, takes_any = _signature(factory)
    name = getattr(factory, "__name__", str(factory))
    problems: list[str] = []
    for key, value in settings.items():
        if key not in params:
            if not takes_any:
                problems.append(_unknown_setting(f"{path}.{key}", name, params))
        elif key in hints:
            _check_value(f"{path}.{key}", value, hints[key], problems)
    problems += [f"{path}.{key}: required by {name} but not set" for key, param in params.items()
                 if param.default is inspect.Parameter.empty and key not in settings]
    return problems


def _signature(factory: Any) -> tuple[dict[str, inspect.Parameter], dict[str, Any], bool]:
    """`factory`'s named parameters, their type hints (none where they do not resolve), whether it takes **kwargs."""
    signature = inspect.signature(factory)
    try:
        hints = typing.get_type_hints(factory.__init__ if inspect.isclass(factory) else factory)
    except Exception:  # unresolvable annotations: check names only
        hints = {}
    params = {n: p for n, p in signature.parameters.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    return params, hints, any(p.kind == p.VAR_KEYWORD for p in signature.parameters.values())


def _unknown_setting(key: str, name: str, params: Mapping[str, inspect.Parameter]) -> str:
    return f"{key}: unknown setting for {name}; allowed: {', '.join(sorted(params)) or '(none)'}"


def _check_component(path: str, node: DictConfig, problems: list[str]) -> None:
    target = node["_target_"]
    try:
        factory = get_object(target)
    except Exception as err:
        problems.append(f"{path}._target_={target!r} cannot be imported ({err})")
        return
    params, hints, takes_any = _signature(factory)
    for key in node:
        if key in HYDRA_KEYS:
            continue
        if key not in params:
            if not takes_any:
                problems.append(_unknown_setting(f"{path}.{key}", _short(target), params))
            continue
        value = _value(node, key, path, problems)
        if isinstance(value, DictConfig) and OmegaConf.is_interpolation(node, key):
            continue  # a shared component (trainer.policy: ${policy}): checked where it is defined
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
