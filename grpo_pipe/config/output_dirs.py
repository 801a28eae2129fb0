"""Where a job writes, checked before Hydra runs it: a folder that cannot be created is one error in the project's
format naming the setting and the path, not Hydra's traceback from deep inside its launcher."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path

# Hydra's output folders and their defaults (conf/config.yaml); the time-stamped part is made by Hydra itself.
OUTPUT_KEYS = {"hydra.run.dir": "outputs/runs", "hydra.sweep.dir": "outputs/multiruns"}


def _output_dirs(args: Sequence[str], cwd: Path) -> dict[str, tuple[str, Path]]:
    """key -> (its value, given on the command line or the default; the value's fixed part, up to the first
    `${...}`, under `cwd`)."""
    given = dict(OUTPUT_KEYS)
    for arg in args:
        key, sep, value = arg.lstrip("+").partition("=")
        if sep and key in OUTPUT_KEYS:
            given[key] = value
    folders = {}
    for key, value in given.items():
        fixed = Path(value.split("${", 1)[0] or ".")
        folders[key] = (value, fixed if fixed.is_absolute() else cwd / fixed)
    return folders


def output_dir_problems(args: Sequence[str], cwd: Path) -> list[str]:
    """One problem per output folder (given on the command line, or the default under `cwd`) whose fixed part
    could not be created: its nearest existing ancestor is a file, or a folder where a file cannot be made
    (permissions, a read-only file system). Nothing is left behind by the check."""
    problems = []
    for key, (value, folder) in _output_dirs(args, cwd).items():
        reason = _unwritable(folder)
        if reason:
            problems.append(f"{key}={value}: cannot write {folder} ({reason}); choose a folder this user can write, "
                            f"e.g. {key}=/tmp/grpo_pipe/{Path(OUTPUT_KEYS[key]).name}")
    return problems


def _unwritable(folder: Path) -> str | None:
    """Why nothing can be written at `folder` (None when it can): tried with a temporary file in the nearest
    folder that exists, which the root user's permission bypass and a read-only mount both answer truly."""
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    if not existing.is_dir():
        return f"{existing} is a file"
    try:
        with tempfile.TemporaryFile(dir=existing):
            return None
    except OSError as err:
        return err.strerror or str(err)


def unmade_output_dirs(args: Sequence[str], cwd: Path) -> list[Path]:
    """For each output folder, the outermost of its fixed part's folders that does not exist yet (`outputs/` on a
    first run): what the job will have made, and what a job refused by its config check removes again."""
    unmade = []
    for _, folder in _output_dirs(args, cwd).values():
        missing = [p for p in (folder, *folder.parents) if not p.exists()]
        if missing:
            unmade.append(missing[-1])
    return unmade


def remove_if_empty(folder: Path) -> None:
    """Remove `folder` when it holds nothing but empty folders (a refused job's outputs/runs/); else leave it all."""
    if not folder.is_dir():
        return
    inside = list(folder.rglob("*"))
    if any(p.is_symlink() or not p.is_dir() for p in inside):
        return
    for inner in sorted(inside, key=lambda p: len(p.parts), reverse=True):  # the deepest first
        inner.rmdir()
    folder.rmdir()
