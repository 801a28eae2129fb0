"""The broadcast bridge's reaction to a lost peer, with an engine whose workers never finish receiving: the one
case a real cluster cannot stage on cue (a node that dies exactly inside a push)."""
from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

from grpo_pipe.bridges.nccl import BroadcastBridge
from grpo_pipe.interfaces import SendingPolicy
from grpo_pipe.trainer.errors import TrainerLost


class _StuckEngine:
    """Its workers join the group, then wait in the broadcast for a sender that never comes (until released)."""

    weight_dtype = torch.float32

    def __init__(self) -> None:
        self.release = threading.Event()
        self.called: list[str] = []

    def worker_count(self) -> int:
        return 1

    def call_workers(self, method: str, *args: Any, timeout_s: float | None = None) -> list[Any]:
        self.called.append(method)
        if method == "grpo_receive_weights":
            self.release.wait()
        return [None]

    def after_external_weight_update(self) -> None: ...

    def is_running(self) -> bool:
        return True


class _DyingSender:
    """A policy that broadcasts from its own process, whose rank dies inside the broadcast."""

    sends_own_weights = True

    def named_weights(self) -> list[tuple[str, torch.Tensor]]:
        raise AssertionError("a policy that sends its own weights is never gathered here")

    def save_pretrained(self, path: Any, dtype: torch.dtype | None = None) -> None: ...

    def weight_specs(self) -> list[tuple[str, tuple[int, ...]]]:
        return [("layer.weight", (4, 4))]

    def open_weight_group(self, backend: str, host: str, port: int, timeout_s: float, world_size: int) -> None: ...

    def broadcast_weights(self, wire_plan: list[dict[str, Any]]) -> dict[str, float]:
        raise TrainerLost("trainer rank 1 of 2 died")

    def close_weight_group(self) -> None: ...


def test_a_trainer_rank_lost_mid_push_is_raised_at_once_and_close_leaves_the_stuck_workers_to_shutdown() -> None:
    engine = _StuckEngine()
    bridge = BroadcastBridge(backend="gloo", timeout_s=3.0)  # were the engine's call waited for: a TimeoutError
    assert isinstance(_DyingSender(), SendingPolicy)  # so `connect` takes the sending-policy path
    try:
        bridge.connect(engine, _DyingSender())  # type: ignore[arg-type]  # the Protocols' runtime checks pass
        with pytest.raises(TrainerLost, match="rank 1 of 2 died"):
            bridge.push(_DyingSender(), version=1)  # type: ignore[arg-type]
        bridge.close()  # a polite close would queue behind the workers' stuck receive until its timeout
        assert "grpo_close_weight_group" not in engine.called
    finally:
        engine.release.set()
        bridge.close()
