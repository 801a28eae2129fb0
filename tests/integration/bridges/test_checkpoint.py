from tests.bridge_equality import train_sync_and_compare


def test_checkpoint_restart_matches_a_fresh_engine(compose_cfg, tmp_path) -> None:
    stats = train_sync_and_compare(compose_cfg(["weight_bridge=checkpoint", "trainer.optimisation.lr=2e-3"]), tmp_path / "saved")
    assert stats.bytes_moved > 0 and stats.load_s > 0  # the engine really restarted
