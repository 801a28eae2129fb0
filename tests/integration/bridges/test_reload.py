
from tests.bridge_equality import train_sync_and_compare


def test_reload_matches_a_fresh_engine(compose_cfg, tmp_path) -> None:
    stats = train_sync_and_compare(compose_cfg(["weight_bridge=reload", "trainer.optimisation.lr=2e-3"]), tmp_path / "saved")
    assert stats.bytes_moved > 0 and stats.transport_s == 0.0  # in-process: nothing is serialised


def test_reload_into_an_engine_process_matches_a_fresh_engine(compose_cfg, tmp_path) -> None:
    # The engine core in its own process (the GPU default): the worker maps shared buckets, no files, no RPC payload.
    cfg = compose_cfg(["weight_bridge=reload", "rollout.layout.in_process=false", "weight_bridge.bucket_mb=1",
                       "trainer.optimisation.lr=2e-3"])
    stats = train_sync_and_compare(cfg, tmp_path / "saved")
    assert stats.bytes_moved > 0 and stats.transport_s == 0.0
