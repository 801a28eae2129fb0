"""Build-once model folders: written under a temporary name and renamed, so a killed build never
leaves a half-written model that a later run would trust."""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)


def build_once(target: Path, build: Callable[[Path], None], description: str) -> Path:
    """Return `target`, calling `build(tmp_dir)` first if it does not exist yet."""
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    log.info("Building %s into %s (once; later runs reuse it)", description, target)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        build(tmp)
        try:
            tmp.rename(target)
        except OSError:  # another process finished first: keep theirs
            if not (target / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
