"""What every weight sync must do, done once here for every bridge.

A bridge only moves weights and reports the phases only it can see (gather, transport, load). The
caller pushes through `push_weights`, which times the whole sync and records the version the engine
serves afterwards; `sync_due` says when a push is due and `sync_every_rule` states the setting's rule.
"""

from __future__ import annotations

import time
from dataclasses import replace

from grpo_pipe.config.sources import CONF_DIR
from grpo_pipe.interfaces import Policy, RolloutEngine, WeightBridge
from grpo_pipe.types import SyncStats


def sync_every_rule(sync_every: int) -> tuple[bool, str]:
    """The rule of every bridge's `sync_every`, for the bridge's `config_problems`."""
    return sync_every >= 1, f"weight_bridge.sync_every={sync_every}: must be >= 1"


def sync_due(version: int, pushed_version: int, sync_every: int) -> bool:
    """A push is due every `sync_every` policy versions, and only for a version not pushed yet."""
    return version % sync_every == 0 and version > pushed_version


def push_weights(bridge: WeightBridge, engine: RolloutEngine, policy: Policy, version: int) -> SyncStats:
    """Push `policy` as `version` through `bridge`; the engine serves `version` afterwards.

    `total_s` is the wall time of the whole push, measured here for every bridge alike."""
    started = time.perf_counter()
    stats = bridge.push(policy, version)
    engine.served_version = version
    return replace(stats, total_s=time.perf_counter() - started, policy_version=version)


def configured_bridges() -> list[str]:
    """The `weight_bridge=` options, read from the config group (the one list of bridges)."""
    return sorted(path.stem for path in (CONF_DIR / "weight_bridge").glob("*.yaml"))
