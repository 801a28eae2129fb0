from pathlib import Path

import pytest
import torch

from grpo_pipe.bridges.lora_hotswap import LoraHotSwapBridge
from grpo_pipe.config.validate import ConfigError
from grpo_pipe.pipeline import build
from tests.bridge_equality import train_sync_and_compare


@pytest.mark.parametrize("transport", ["memory", "folder"])
def test_lora_hotswap_matches_a_fresh_engine_on_merged_weights(compose_cfg, tmp_path, transport) -> None:
    cfg = compose_cfg(["weight_bridge=lora", f"weight_bridge.transport={transport}", "trainer.lr=5e-3",
                       "policy.rank=8", "policy.alpha=16"])
    assert cfg.policy._target_.endswith("LoraPolicy")
    seen: dict[str, object] = {}

    def note_transport(parts) -> None:
        bridge = parts.weight_bridge
        seen["transport"] = type(bridge._transport).__name__

    stats = train_sync_and_compare(cfg, tmp_path / "saved", before_close=note_transport)
    assert stats.bytes_moved < 1_000_000  # only the adapter moves
    assert seen == {"transport": {"memory": "MemoryTransport", "folder": "FolderTransport"}[transport]}


def test_lora_bridge_refuses_a_full_policy(compose_cfg) -> None:
    with pytest.raises(ConfigError, match="weight_bridge=lora needs policy=lora"):
        build(compose_cfg(["weight_bridge=lora", "policy=full"]))


def test_lora_transport_is_checked_before_anything_loads(compose_cfg) -> None:
    with pytest.raises(ConfigError, match="transport='disk': must be one of auto, memory, folder"):
        build(compose_cfg(["weight_bridge=lora", "weight_bridge.transport=disk"]))
    remote = RemoteAdapterEngine()  # serves adapters, but from files only (as an engine behind Ray does)
    assert any("transport=memory needs a vLLM engine" in p for p in LoraHotSwapBridge(transport="memory").check(remote, None))
    assert not any("transport" in p for p in LoraHotSwapBridge(transport="auto").check(remote, None))


class RemoteAdapterEngine:
    weight_dtype = torch.bfloat16

    def use_adapter(self, name: str, adapter_id: int, folder: Path) -> None: ...

    def retire_adapter(self, adapter_id: int) -> None: ...
