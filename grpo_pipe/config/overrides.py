"""Command-line overrides checked before Hydra runs the job: a key that exists nowhere gets the project's one
error block with the nearest allowed names, instead of Hydra's advice to append it with `+` (which would only
move the mistake to the component that then refuses it)."""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Sequence

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import ConfigCompositionException, OverrideParseException
from omegaconf import DictConfig, OmegaConf

from grpo_pipe.config.errors import ConfigError
from grpo_pipe.config.sources import CONF_DIR

UNKNOWN = re.compile(r"Could not override '([^']+)'")


def override_problems(args: Sequence[str]) -> list[str]:
    """Every override naming an option or a key that does not exist, all at once: options first (`weight_bridge=ncl`),
    then keys (keys under a group whose option is unknown are not judged: they belong to the option meant)."""
    options = unknown_option_problems(args)
    wrong_groups = {problem.split("=", 1)[0] for problem in options}
    judged = [a for a in args if not any(a.split("=", 1)[0] == g or a.startswith(g + ".") for g in wrong_groups)]
    return options + unknown_key_problems(judged)


def unknown_option_problems(args: Sequence[str]) -> list[str]:
    """`group=option` overrides (sweep lists included) whose option no config source has (the shipped conf/, a
    ./conf/ of the user's), with the nearest option and every allowed one."""
    picks = [a for a in args if "=" in a and not a.startswith("-") and _is_group_key(a.partition("=")[0])]
    if not picks:
        return []
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        known = set(loader.list_groups(""))
        groups = {key: sorted(loader.get_group_options(key)) for key in {a.partition("=")[0] for a in picks}
                  if key in known}
    problems = []
    for arg in picks:
        key, _, value = arg.partition("=")
        options = groups.get(key)
        if options is None:
            continue
        for option in (v.strip() for v in value.split(",")):
            if option not in options and option != "null":
                nearest = difflib.get_close_matches(option, options, n=1, cutoff=0.5)
                hint = f"; nearest: {nearest[0]}" if nearest else ""
                problems.append(f"{key}={option}: unknown option{hint}; allowed: {', '.join(options)}")
    return problems


def _is_group_key(key: str) -> bool:
    """`key=...` picks a config group's option (not a setting, an appended key, a deletion or Hydra's own)."""
    return "." not in key and "/" not in key and not key.startswith(("+", "~", "hydra"))


def unknown_key_problems(args: Sequence[str]) -> list[str]:
    """One problem per override whose key the composed config does not have, every one named at once; empty
    when all keys exist or when Hydra's own parser should speak (sweep syntax, a bad value). One composition
    when nothing is wrong; one more per unknown key."""
    given = [a for a in args if "=" in a and not a.startswith("-")]
    if any("." not in a.split("=", 1)[0] and "," in a.split("=", 1)[1] for a in given):
        return []  # a sweep over a group's options: which keys exist differs per job; Hydra judges each
    overrides = [a for a in given if "," not in a.split("=", 1)[1]]
    choices, problems = _group_choices(overrides), []
    while overrides:
        try:
            _compose(overrides)
            break
        except ConfigCompositionException as err:
            found = UNKNOWN.search(str(err))
            if not found or found.group(1) not in {o.split("=", 1)[0] for o in overrides}:
                break  # not an unknown key: Hydra reports it in its own words
            key = found.group(1)
            problems.append(_unknown(key, choices))
            overrides = [o for o in overrides if o.split("=", 1)[0] != key]
        except Exception:  # noqa: BLE001 - anything else is Hydra's to report
            break
    return problems


def _group_choices(overrides: Sequence[str]) -> list[str]:
    """The options picked for config groups (`data=jsonl`, `+sweeps=compare_bridges`): they decide which keys
    exist. Sweep lists are left to Hydra."""
    picks = []
    for override in overrides:
        key, _, value = override.partition("=")
        if "." not in key and not key.startswith(("~", "hydra")) and "," not in value:
            picks.append(override)
    return picks


def _compose(overrides: list[str]) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def _unknown(key: str, choices: list[str]) -> str:
    """`trainer.lrr: unknown key; nearest: trainer.optimisation.lr; allowed under trainer: ...`, read from the config
    as the chosen group options compose it."""
    parent, _, leaf = key.rpartition(".")
    try:
        node = OmegaConf.select(_compose(choices), parent) if parent else _compose(choices)
    except Exception:  # noqa: BLE001 - without a readable parent, name the key alone
        node = None
    keys = sorted(str(k) for k in node.keys()) if isinstance(node, DictConfig) else []
    by_name: dict[str, list[str]] = {}  # a key's name -> its paths under `parent`, one level down included
    for path in keys + _one_level_down(node):
        by_name.setdefault(path.rpartition(".")[2], []).append(path)
    nearest = [path for name in difflib.get_close_matches(leaf, list(by_name), n=3, cutoff=0.5) for path in by_name[name]]
    prefix = f"{parent}." if parent else ""
    hint = f"; nearest: {', '.join(prefix + n for n in nearest)}" if nearest else ""
    allowed = f"; allowed{' under ' + parent if parent else ''}: {', '.join(keys)}" if keys else ""
    return f"{key}: unknown key{hint}{allowed}"


def _one_level_down(node: object) -> list[str]:
    """`group.key` for the keys of `node`'s own settings groups (not the components it shares): a setting that lives in
    a group (`trainer.optimisation.lr`) is found by its name alone (`trainer.lr`)."""
    if not isinstance(node, DictConfig):
        return []
    return [f"{key}.{sub}" for key in node.keys() if not OmegaConf.is_interpolation(node, str(key))
            and isinstance(node[key], DictConfig) for sub in node[key].keys()]


def problems_beside(args: Sequence[str], found: Sequence[str], build: Callable[[DictConfig], object]) -> list[str]:
    """The value and combination problems of the config composed without the overrides `found` already names, so
    that one command's mistakes are all reported at once, not one kind per try. `build` is the runner's own check
    of a composed config (the runner sits above this package). Empty for a sweep or another mode (each job's config
    differs: Hydra composes them one by one) and when the rest does not compose."""
    if any(a.startswith("-") or swept_key(a) is not None for a in args):
        return []
    named = {problem.split(":", 1)[0].split("=", 1)[0] for problem in found}
    rest = [a for a in args if "=" in a and a.split("=", 1)[0].lstrip("+~") not in named]
    try:
        build(_compose(rest))
    except ConfigError as err:
        return err.problems
    except Exception:  # noqa: BLE001 - not a mistake in a value: Hydra or the job reports it in its own words
        return []
    return []


def swept_key(arg: str) -> str | None:
    """The key of a command-line override that sweeps (`key=a,b`, `range(...)`, `choice(...)`), by Hydra's own
    grammar: a list value in brackets or a quoted string with commas is one value. None for anything else."""
    if arg.startswith("-") or "=" not in arg:
        return None
    try:
        override = OverridesParser.create().parse_override(arg)
    except OverrideParseException:  # Hydra refuses it itself, with its own message
        return None
    return override.key_or_group if override.is_sweep_override() else None
