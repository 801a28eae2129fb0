import pytest

from grpo_pipe.config.validate import ConfigError
from grpo_pipe.pipeline import build
from tests.bridges.equality import train_sync_and_compare


def test_lora_hotswap_matches_a_fresh_engine_on_merged_weights(compose_cfg, tmp_path) -> None:
    cfg = compose_cfg(["weight_bridge=lora", "trainer.lr=5e-3", "policy.rank=8", "policy.alpha=16"])
    assert cfg.policy._target_.endswith("LoraPolicy")
    stats = train_sync_and_compare(cfg, tmp_path / "saved")
    assert stats.bytes_moved < 1_000_000  # only the adapter moves


def test_lora_bridge_refuses_a_full_policy(compose_cfg) -> None:
    with pytest.raises(ConfigError, match="weight_bridge=lora needs policy=lora"):
        build(compose_cfg(["weight_bridge=lora", "policy=full"]))
