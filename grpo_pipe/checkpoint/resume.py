"""Resuming a run: which checkpoint `resume=` names (verified against its manifest), which of its settings changed,
and the overrides the resumed job composes its config from."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from grpo_pipe.checkpoint.store import STEP_PREFIX, Checkpoint, CorruptCheckpointError

log = logging.getLogger(__name__)


def find_resume_checkpoint(resume: str, runs_dir: Path) -> Checkpoint:
    """`resume`: a run output folder, its checkpoints folder, one checkpoint, or `latest` (the newest
    checkpoint of any run under `runs_dir`), verified against its manifest. `latest` passes over one that
    fails, with a warning naming it and what failed, to the one before; a folder named by the user that fails
    raises CorruptCheckpointError naming the file (another checkpoint is never taken in its place).
    Raises FileNotFoundError saying what was looked for."""
    if resume == "latest":
        candidates = sorted((p for p in runs_dir.glob(f"*/checkpoints/{STEP_PREFIX}*") if p.is_dir()),
                            key=lambda p: (p.stat().st_mtime, p.name))  # the name orders two saved in one clock tick
        if not candidates:
            raise FileNotFoundError(f"resume=latest: no checkpoint under {runs_dir}/*/checkpoints/")
        for path in reversed(candidates):
            problems = Checkpoint(path).problems()
            if not problems:
                return Checkpoint(path)
            log.warning("resume=latest: skipping %s, which fails verification: %s; trying the checkpoint before it",
                        path, "; ".join(problems))
        raise CorruptCheckpointError(f"resume=latest: none of the {len(candidates)} checkpoints under "
                                     f"{runs_dir}/*/checkpoints/ verifies (each is named in a warning above)")
    path = Path(resume)
    if path.name.startswith(STEP_PREFIX) and path.is_dir():
        return _verified(resume, Checkpoint(path), older=[])
    for folder in (path / "checkpoints", path):
        found = sorted(p for p in folder.glob(f"{STEP_PREFIX}*") if p.is_dir())
        if found:
            return _verified(resume, Checkpoint(found[-1]), older=found[:-1])
    raise FileNotFoundError(f"resume={resume}: no checkpoint in {path}/checkpoints/ or {path}/")


def _verified(resume: str, checkpoint: Checkpoint, older: Sequence[Path]) -> Checkpoint:
    """The checkpoint if it matches its manifest; else an error naming what failed and, if one verifies, the
    checkpoint before it (the user named this folder: which one to take instead is theirs to say)."""
    problems = checkpoint.problems()
    if not problems:
        return checkpoint
    instead = next((p for p in reversed(older) if not Checkpoint(p).problems()), None)
    hint = f"; the checkpoint before it verifies: resume={instead}" if instead is not None else ""
    raise CorruptCheckpointError(f"resume={resume}: {checkpoint.path} fails verification: {'; '.join(problems)}{hint}")


def config_differences(saved: Mapping[str, Any], current: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two resolved configs."""
    keys = set(saved) | set(current)
    out = []
    for key in sorted(keys):
        a, b = saved.get(key), current.get(key)
        name = f"{prefix}{key}"
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            out.extend(config_differences(a, b, f"{name}."))
        elif a != b:
            out.append(name)
    return out


def resumed_overrides(saved: Sequence[str], given: Sequence[str]) -> list[str]:
    """The overrides a resumed job composes its config from: the checkpoint's job's, then the ones given with
    `resume=` (a key given again takes the new value, which the resume check then holds to resume_accept).
    Hydra's own settings (output folder) and the resume keys themselves are not carried over."""

    def key(override: str) -> str:
        return override.split("=", 1)[0].lstrip("+~")

    merged: dict[str, str] = {}
    for override in [*saved, *given]:
        name = key(override)
        if name.startswith(("hydra.", "hydra/")) or name in ("resume", "resume_accept"):
            if override in given:
                merged[name] = override
            continue
        merged[name] = override
    return list(merged.values())
