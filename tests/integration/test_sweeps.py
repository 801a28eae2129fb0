"""Every sweep in sweeps/ composes; the bridge comparison really runs: one parent, a child per bridge, and
the comparison of the bridges on the parent."""

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from mlflow.tracking import MlflowClient

from tests.conftest import CONF, SWEEPS, TINY
from tests.sweep_runs import run_sweep

SWEEP_NAMES = sorted(p.stem for p in SWEEPS.glob("*.yaml"))


@pytest.mark.parametrize("sweep", SWEEP_NAMES)
def test_sweep_composes_with_params(sweep: str, monkeypatch) -> None:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[f"+sweeps={sweep}"], return_hydra_config=True)
    assert cfg.hydra.sweeper.params, f"sweeps/{sweep}.yaml sweeps nothing"


def test_compare_bridges_gives_a_child_per_bridge_with_sync_metrics(tmp_path: Path) -> None:
    overrides = [*TINY, "trainer.optimisation.lr=1e-3", "run.eval_size=4"]
    runs = run_sweep(tmp_path, ["+sweeps=compare_bridges", "trainer.steps=2", *overrides])  # no -m: it sets it
    client, parents, children = runs.client, runs.parents, runs.children
    assert len(parents) == 1 and {c.data.tags["mlflow.parentRunId"] for c in children} == {parents[0].info.run_id}
    bridges = sorted(c.data.params["weight_bridge._target_"].rsplit(".", 1)[-1] for c in children)
    assert bridges == ["BroadcastBridge", "CheckpointRestartBridge", "LoraHotSwapBridge", "ReloadBridge"]
    for child in children:
        assert child.data.metrics["policy/version"] == 2.0
        assert child.data.metrics["sync/bytes"] > 0 and child.data.metrics["sync/total_s"] > 0
        assert child.data.tags["grpo_pipe.choice.weight_bridge"] in {"reload", "lora", "nccl", "checkpoint"}
        assert child.data.tags["grpo_pipe.choice.sweeps"] == "compare_bridges"
        # named by what differs, so MLflow's runs table tells the children apart
        assert child.info.run_name == f"weight_bridge={child.data.tags['grpo_pipe.choice.weight_bridge']}"
        assert not [k for k in child.data.metrics if k.startswith("async/")]  # a synchronous loop
        assert child.data.metrics["Headline/reward"] == child.data.metrics["train/reward/mean"]
    _assert_the_parent_compares_the_bridges(client, parents[0], children, tmp_path)
    # the end of the sweep prints the parent run's link whole, on a line of its own
    link = f"/#/experiments/{parents[0].info.experiment_id}/runs/{parents[0].info.run_id}"
    assert f"  the parent run: http://127.0.0.1:5000{link}\n" in runs.output, runs.output[-2000:]


def _assert_the_parent_compares_the_bridges(client: MlflowClient, parent, children, tmp_path: Path) -> None:
    """The end-of-sweep callback wrote the comparison: a row per bridge, the plots, the page, params, best."""
    parent_id = parent.info.run_id
    assert client.get_run(parent_id).info.status == "FINISHED"
    table = json.loads(Path(client.download_artifacts(parent_id, "comparison/comparison.json", str(tmp_path))).read_text())
    rows = {row[0]: dict(zip(table["columns"], row)) for row in table["data"]}
    assert set(rows) == {f"weight_bridge={b}" for b in ("reload", "lora", "nccl", "checkpoint")}
    for row in rows.values():
        assert row["status"] == "FINISHED" and row["sync_total_s"] > 0 and row["sync_bytes_total"] > 0
        assert row["rollout_tokens_per_s"] > 0 and row["step_s"] > 0 and row["objective"] == "summary/step_s"
    files = {f.path.rsplit("/", 1)[-1] for f in client.list_artifacts(parent_id, "comparison")}
    assert {"curves.png", "sync_breakdown.png", "throughput.png", "comparison.html"} <= files
    params = client.get_run(parent_id).data.params
    assert sorted(params["weight_bridge"].split(",")) == ["checkpoint", "lora", "nccl", "reload"]
    fastest = min(c.data.metrics["summary/step_s"] for c in children)  # the sweep's objective, minimised
    assert client.get_run(parent_id).data.metrics["best/summary/step_s"] == fastest
