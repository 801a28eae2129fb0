from tests.bridges.equality import train_sync_and_compare


def test_reload_matches_a_fresh_engine(compose_cfg, tmp_path) -> None:
    stats = train_sync_and_compare(compose_cfg(["weight_bridge=reload", "trainer.lr=2e-3"]), tmp_path / "saved")
    assert stats.bytes_moved > 0 and stats.transport_s == 0.0  # in-process: nothing is serialised
