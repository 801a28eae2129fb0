"""LoRA hot-swap: each sync saves the trained adapter and the running engine switches to it.

The base weights never move; only the adapter (a few MB) is written and loaded. The engine is
never restarted. An adapter is retired only once no request uses it: in the synchronous loop every
request of the previous version has finished when `push` runs, so all older adapters go at once;
`max_loras` slots bound how many versions can be live together (async loops need staleness + 2).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from grpo_pipe import env
from grpo_pipe.bridges.contract import check_sync_every
from grpo_pipe.bridges.files import folder_bytes, replace_atomically
from grpo_pipe.interfaces import AdapterEngine, AdapterPolicy
from grpo_pipe.types import SyncStats


class LoraHotSwapBridge:
    def __init__(self, sync_every: int = 1, max_lora_rank: int = 16, max_loras: int = 2) -> None:
        if max_loras < 2:
            raise ValueError(f"weight_bridge.max_loras={max_loras}: must be >= 2 (the old and the new adapter)")
        self.sync_every = check_sync_every(sync_every)
        self.max_lora_rank = max_lora_rank
        self.max_loras = max_loras
        self.engine: Any = None
        self._root: Path | None = None
        self._live: list[int] = []  # adapter ids loaded in the engine, oldest first

    def check(self, engine: object, policy: object) -> list[str]:
        problems = []
        if not isinstance(engine, AdapterEngine):
            problems.append(f"weight_bridge=lora needs an engine that serves LoRA adapters, got {type(engine).__name__}")
        if not isinstance(policy, AdapterPolicy):
            problems.append(f"weight_bridge=lora needs policy=lora, got {type(policy).__name__}")
        elif policy.rank > self.max_lora_rank:
            problems.append(f"policy.rank={policy.rank} > weight_bridge.max_lora_rank={self.max_lora_rank}")
        return problems

    def engine_options(self) -> dict[str, Any]:
        return {"enable_lora": True, "max_lora_rank": self.max_lora_rank, "max_loras": self.max_loras}

    def connect(self, engine: Any, policy: Any) -> None:
        self.engine = engine
        # RAM-backed when possible: the adapter is written and read back once per sync.
        self._root = Path(tempfile.mkdtemp(prefix="grpo_pipe-lora-", dir=env.fast_scratch_dir()))

    def push(self, policy: AdapterPolicy, version: int) -> SyncStats:
        if self.engine is None or self._root is None:
            raise RuntimeError("bridge used before connect()")
        started = time.perf_counter()
        folder = self._root / f"v{version}"
        tmp = self._root / f".v{version}.tmp"
        policy.save_adapter(tmp, dtype=self.engine.weight_dtype)
        replace_atomically(tmp, folder)
        written = time.perf_counter()
        self.engine.use_adapter(f"policy-v{version}", version, folder)
        loaded = time.perf_counter()
        self._retire_all_but(version)
        return SyncStats(
            gather_s=0.0,
            transport_s=written - started,
            load_s=loaded - written,
            pause_s=loaded - started,
            bytes_moved=folder_bytes(folder),
            policy_version=version,
        )

    def _retire_all_but(self, version: int) -> None:
        assert self.engine is not None and self._root is not None
        for old in self._live:
            self.engine.retire_adapter(old)
            shutil.rmtree(self._root / f"v{old}", ignore_errors=True)
        self._live = [version]

    def close(self) -> None:
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
        self.engine, self._root, self._live = None, None, []
