import time
from pathlib import Path

import pytest
import torch

from grpo_pipe.bridges.contract import push_weights
from grpo_pipe.bridges.lora import LoraHotSwapBridge
from grpo_pipe.config.errors import ConfigError
from grpo_pipe.interfaces import AdapterEngine, MemoryAdapterEngine
from grpo_pipe.runner.pipeline import build
from grpo_pipe.types import SamplingSettings
from tests.bridge_equality import train_sync_and_compare


@pytest.mark.parametrize("transport", ["memory", "folder"])
def test_lora_hotswap_matches_a_fresh_engine_on_merged_weights(compose_cfg, tmp_path, transport) -> None:
    cfg = compose_cfg(["weight_bridge=lora", f"weight_bridge.transport={transport}", "trainer.optimisation.lr=5e-3",
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
    assert isinstance(remote, AdapterEngine) and not isinstance(remote, MemoryAdapterEngine)
    assert any("transport=memory needs a vLLM engine" in p for p in LoraHotSwapBridge(transport="memory").check(remote, None))
    assert not any("transport" in p for p in LoraHotSwapBridge(transport="auto").check(remote, None))


class RemoteAdapterEngine:
    weight_dtype = torch.bfloat16

    def use_adapter(self, name: str, adapter_id: int, folder: Path) -> None: ...

    def retire_adapter(self, adapter_id: int) -> None: ...


# Long enough that the generation is still running when the pushes land, however loaded the machine.
RUNNING = SamplingSettings(temperature=1.0, top_p=1.0, max_tokens=200, seed=3, extra={"ignore_eos": True})


@pytest.mark.parametrize("transport", ["memory", "folder"])
def test_adapters_pushed_while_a_generation_runs_leave_its_adapter_until_it_ends(compose_cfg, transport) -> None:
    # Async rollouts: a generation call runs on adapter 1 while the trainer pushes 2 and 3 (each push retires every
    # older adapter). The running call must finish on adapter 1, which goes only when it ends.
    parts = build(compose_cfg(["weight_bridge=lora", f"weight_bridge.transport={transport}"]))
    engine, trainer, bridge = parts.rollout, parts.trainer, parts.weight_bridge
    engine.background = True  # generate on a thread of its own, as the runner does when it may run ahead
    assert isinstance(engine, MemoryAdapterEngine)  # the vLLM engine is the Protocol the memory transport needs
    model_path = parts.model.materialize()
    engine.connect(model_path, bridge.engine_options())
    try:
        trainer.setup(model_path, parts.placement.trainer_device(), pad_id=0)
        bridge.connect(engine, trainer.policy)
        push_weights(bridge, engine, trainer.policy, 1)
        running = engine.submit([[5, 6, 7, 8]] * 3, [2] * 3, RUNNING)
        deadline = time.monotonic() + 120
        while engine.generation_steps() < 4:
            assert time.monotonic() < deadline, "the generation never got going"
            time.sleep(0.001)

        def push_two_more() -> tuple[bool, set[int]]:
            # Run by the generating thread between two steps of the running call, which waits meanwhile: both pushes
            # land while it provably runs, however long they take on a loaded machine (as a sync from the trainer's
            # thread lands: between two steps).
            push_weights(bridge, engine, trainer.policy, 2)
            push_weights(bridge, engine, trainer.policy, 3)
            return engine.is_generating(), set(engine.adapters.leased())

        mid_generation, leased = engine.between_steps(push_two_more)
        assert mid_generation and leased == {1}  # adapter 1 stays while the call that runs on it lasts
        during = running.result().completions
        assert all(len(c.token_ids) == 200 and c.policy_version == 1 for group in during for c in group)
        assert engine.adapters.leased() == set()
        assert engine.llm.llm_engine.list_loras() == {3}  # 1 went when its call ended, 2 at the third push
        after = engine.generate([[5, 6, 7, 8]], [2], RUNNING)
        assert all(c.policy_version == 3 for group in after for c in group)
    finally:
        bridge.close()
        engine.shutdown()
        parts.placement.close()
