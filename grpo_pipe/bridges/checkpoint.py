"""Checkpoint and restart, the legacy path: write a full Hugging Face checkpoint, then restart the
engine on it. The engine holds no state between syncs, so this works with any engine layout; its
cost is a full write plus an engine start per sync (`sync_every` trades freshness for that cost).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from grpo_pipe.bridges.contract import sync_every_rule
from grpo_pipe.config.errors import failed
from grpo_pipe.interfaces import Policy, RolloutEngine
from grpo_pipe.models.files import copy_tokenizer_files, folder_bytes, replace_atomically
from grpo_pipe.types import SyncStats


class CheckpointRestartBridge:
    """`weight_bridge=checkpoint`: a full Hugging Face checkpoint is written and the engine restarted on it.

    Args:
        sync_every: The restart interval, in optimizer steps (freshness against a write and an engine start).
        keep_last: Checkpoints kept on disk.
        directory: Where they are written; None: a temporary folder removed at the end.
    """

    def __init__(self, sync_every: int = 1, keep_last: int = 1, directory: str | None = None) -> None:
        self.sync_every = sync_every
        self.keep_last = keep_last
        self.directory = directory
        self.engine: RolloutEngine | None = None
        self._root: Path | None = None
        self._owns_root = False
        self._source: Path | None = None  # the original model folder: tokenizer files come from it
        self._written: list[Path] = []

    def config_problems(self) -> list[str]:
        return failed(
            sync_every_rule(self.sync_every),
            (self.keep_last >= 1, f"weight_bridge.keep_last={self.keep_last}: must be >= 1"),
        )

    def check(self, engine: object, policy: object) -> list[str]:
        if not isinstance(engine, RolloutEngine):
            return [f"weight_bridge=checkpoint needs a rollout engine, got {type(engine).__name__}"]
        return []

    def engine_options(self) -> dict[str, Any]:
        return {}

    def connect(self, engine: RolloutEngine, policy: Policy) -> None:
        self.engine = engine
        self._source = engine.model_path
        if self.directory is None:
            self._root, self._owns_root = Path(tempfile.mkdtemp(prefix="grpo_pipe-ckpt-")), True
        else:
            self._root = Path(self.directory)
            self._root.mkdir(parents=True, exist_ok=True)

    def push(self, policy: Policy, version: int) -> SyncStats:
        if self.engine is None or self._root is None or self._source is None:
            raise RuntimeError("bridge used before connect()")
        started = time.perf_counter()
        folder = self._root / f"policy-v{version}"
        tmp = Path(tempfile.mkdtemp(prefix=f".policy-v{version}.", dir=self._root))
        policy.save_pretrained(tmp, dtype=self.engine.weight_dtype)  # what the engine would cast to on load
        copy_tokenizer_files(self._source, tmp)
        replace_atomically(tmp, folder)
        written = time.perf_counter()
        self.engine.shutdown()
        self.engine.connect(folder)
        restarted = time.perf_counter()
        self._written.append(folder)
        while len(self._written) > self.keep_last:
            shutil.rmtree(self._written.pop(0), ignore_errors=True)
        return SyncStats(
            gather_s=0.0,
            transport_s=written - started,
            load_s=restarted - written,
            pause_s=restarted - started,
            bytes_moved=folder_bytes(folder),
            policy_version=version,
        )

    def close(self) -> None:
        if self._owns_root and self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
        self.engine, self._root = None, None
