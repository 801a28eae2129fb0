"""The trainer/sampler mismatch metrics on real jobs: numerics alone after every sync (fp32 on CPU, every bridge
that runs on a CPU), and a warning naming the bridge when the engine silently keeps old weights."""

from __future__ import annotations

import logging

import pytest
from mlflow.tracking import MlflowClient

from grpo_pipe.runner.pipeline import JobContext, run
from grpo_pipe.types import SyncStats
from tests.conftest import REPO

# Rewards that differ within each group, so every step really moves the weights; every completion runs
# through the trainer.
MOVING = ["reward=python", f"reward.fn={REPO}/tests/fixtures/length_reward.py:by_length", "reward.success_at=null",
          "trainer.batching.skip_zero_advantage=false"]

# The bridges a CPU machine runs (ipc needs a GPU), with what each needs beside it.
CPU_BRIDGES = {
    "reload": [],
    "checkpoint": [],
    "lora": ["policy=lora"],
    "nccl": ["weight_bridge.bucket_mb=1", "rollout.layout.in_process=false"],
}


@pytest.mark.parametrize("bridge", sorted(CPU_BRIDGES))
def test_after_every_sync_the_engine_matches_the_trainer_to_numerics(bridge, compose_cfg, tmp_path) -> None:
    cfg = compose_cfg([f"weight_bridge={bridge}", *CPU_BRIDGES[bridge], *MOVING, "trainer.steps=3",
                       "trainer.optimisation.lr=2e-3"])
    result = run(cfg, JobContext(output_dir=tmp_path, run_name=f"mismatch-{bridge}"))
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    mismatch = [m.value for m in client.get_metric_history(result.run_id, "mismatch/logprob_abs_mean")]
    applied = [m.value for m in client.get_metric_history(result.run_id, "train/update_applied")]
    versions = [m.value for m in client.get_metric_history(result.run_id, "policy/version")]
    assert all(m.value > 0 for m in client.get_metric_history(result.run_id, "train/tokens"))
    # Steps 2 and 3 were sampled from weights that reached the engine through the bridge.
    assert versions == [1.0, 2.0, 3.0] and applied == [1.0, 1.0, 1.0]
    assert len(mismatch) == 3 and max(mismatch) < 1e-4, mismatch
    for key in ("mismatch/kl_k3", "mismatch/outside_clip_fraction"):
        assert max(m.value for m in client.get_metric_history(result.run_id, key)) < 1e-4, key


class NeverLandsBridge:
    """A broken bridge for the test: every sync reports success, and nothing reaches the engine."""

    def __init__(self, sync_every: int = 1) -> None:
        self.sync_every = sync_every

    def check(self, engine, policy) -> list[str]:
        return []

    def engine_options(self) -> dict:
        return {}

    def connect(self, engine, policy) -> None:
        pass

    def push(self, policy, version: int) -> SyncStats:
        return SyncStats(gather_s=0.0, transport_s=0.0, load_s=0.0, pause_s=0.0, bytes_moved=0, policy_version=version)

    def close(self) -> None:
        pass


def test_an_engine_that_keeps_old_weights_raises_the_warning_once(compose_cfg, tmp_path, caplog) -> None:
    cfg = compose_cfg([f"weight_bridge._target_={__name__}.NeverLandsBridge", "~weight_bridge.bucket_mb",
                       *MOVING, "trainer.steps=4", "trainer.optimisation.lr=5e-2"])
    with caplog.at_level(logging.WARNING, logger="grpo_pipe.runner.step_recorder"):
        result = run(cfg, JobContext(output_dir=tmp_path, run_name="stale"))
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    mismatch = [m.value for m in client.get_metric_history(result.run_id, "mismatch/logprob_abs_mean")]
    assert mismatch[0] < 1e-4 < 0.1 < max(mismatch[1:])  # the base weights are the trainer's only at step 1
    warnings = [r.getMessage() for r in caplog.records if "differ from the trainer's" in r.getMessage()]
    assert len(warnings) == 1 and "NeverLandsBridge" in warnings[0]
