"""Tags that let a person filter runs in MLflow: the code version, the command, and each config group's option."""

from __future__ import annotations

import json
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path

from grpo_pipe.config.overrides import swept_key

COMMIT_TAG = "grpo_pipe.git_commit"
VERSION_TAG = "grpo_pipe.version"
COMMAND_TAG = "grpo_pipe.command"
OVERRIDES_TAG = "grpo_pipe.overrides"
SWEEP_SPEC_TAG = "grpo_pipe.sweep_spec"  # what a multirun varies, as given: `weight_bridge=reload,lora`
CHOICE_PREFIX = "grpo_pipe.choice."
MAX_TAG_CHARS = 5000  # MLflow's limit on a tag value is 8000; commands get long with many overrides


def git_commit(folder: Path) -> str | None:
    """The commit checked out in `folder`'s repository, with `+dirty` when files differ; None outside git."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=folder, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=folder,
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):  # no git installed, or a hung file system
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def package_version() -> str:
    """The installed distribution's version (a run from a wheel has no git commit to tell the code by)."""
    try:
        return metadata.version("grpo_pipe")
    except metadata.PackageNotFoundError:  # imported from a source tree that was never installed
        return "unknown"


def run_tags(argv: Sequence[str], choices: Mapping[str, str | None], overrides: Sequence[str]) -> dict[str, str]:
    """Commit of the running code, the command line, the job's overrides (a JSON list: values may hold commas)
    and `grpo_pipe.choice.<group>=<option>`."""
    tags = {COMMAND_TAG: shlex.join(argv)[:MAX_TAG_CHARS], OVERRIDES_TAG: json.dumps(list(overrides))[:MAX_TAG_CHARS],
            VERSION_TAG: package_version()}
    commit = git_commit(Path(__file__).resolve().parent)  # the code that runs, wherever the job was started
    if commit is not None:
        tags[COMMIT_TAG] = commit
    for group, option in choices.items():
        if option is not None and not group.startswith("hydra"):
            tags[CHOICE_PREFIX + group] = str(option)
    return tags


def job_run_name(overrides: Sequence[str], swept: Sequence[str]) -> str:
    """A run's name in MLflow: in a sweep, only what differs between its jobs (`weight_bridge=lora`), so the runs
    table tells the children apart at a glance; a single job is named by all of its overrides (or "default").
    `swept`: the keys the sweep varies (the sweeper's `params` and command-line values with a comma)."""
    keys = {key.lstrip("+~") for key in swept}
    chosen = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") in keys] if keys else list(overrides)
    return ",".join(chosen) or "default"


def swept_keys(argv: Sequence[str], sweeper_params: Mapping[str, object] | None) -> list[str]:
    """What a multirun varies: the sweeper's `params` (a shipped sweep's) and each command-line override that Hydra
    reads as a sweep (`reward.wrong=0.0,-0.2`, `range(...)`, `choice(...)`; not a list value such as `k=[a,b]`)."""
    keys = [str(k) for k in (sweeper_params or {})]
    keys += [key for key in (swept_key(arg) for arg in argv) if key is not None and key not in keys]
    return keys


def sweep_spec(argv: Sequence[str], sweeper_params: Mapping[str, object] | None) -> str:
    """What a multirun varies, as the user wrote it: the swept command-line overrides, then the sweeper's params
    that the command line did not replace."""
    swept = set(swept_keys(argv, None))
    given = [arg for arg in argv if arg.partition("=")[0].lstrip("+~") in swept]
    given += [f"{k}={v}" for k, v in (sweeper_params or {}).items() if str(k) not in swept]
    return " ".join(given)[:MAX_TAG_CHARS]


def sweep_run_name(spec: str, sweep_dir: str) -> str:
    """The parent run's name: what the sweep varies, then its folder (two sweeps of the same keys stay apart)."""
    varied = spec if len(spec) <= 120 else spec[:117] + "..."
    return f"sweep {varied} ({Path(sweep_dir).name})" if varied else f"sweep {Path(sweep_dir).name}"
