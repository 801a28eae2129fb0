"""Scale-out on a local two-node Ray cluster (`ray.cluster_utils.Cluster`, as Ray's own tests do): a split
job with 2 engine replicas and a 2-rank FSDP trainer, weights over gloo, the live engines equal to a fresh
engine on the trainer's weights after a sync; a node that dies under an engine replica. Plus the config
errors of the scale-out options."""

from __future__ import annotations

import inspect
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from grpo_pipe.config.errors import ConfigError
from grpo_pipe.placement.resources import gpu_problems
from grpo_pipe.rollout.ray_engine import _shares
from grpo_pipe.runner.components import Components
from grpo_pipe.runner.pipeline import JobContext, build, run
from grpo_pipe.trainer.sharded_policy import ShardedPolicy
from tests.bridge_equality import train_sync_and_compare
from tests.processes import once_it_exists

SCALE_OUT = ["placement=split", "trainer=fsdp", "trainer.world_size=2", "weight_bridge=nccl", "placement.num_engines=2"]


@pytest.fixture
def two_nodes() -> Iterator[str]:
    """Two Ray nodes on this machine, 2 CPUs each: 2 engines and 2 trainer ranks cannot all fit on one."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    cluster.add_node(num_cpus=2)
    try:
        yield cluster.address
    finally:
        cluster.shutdown()


def test_two_node_cluster_trains_on_two_ranks_and_syncs_two_replicas(compose_cfg, two_nodes: str, tmp_path,
                                                                    monkeypatch) -> None:
    """Rank 0 broadcasts the weights itself: a sync never gathers the model into this process (at 7B that was
    30 GB through Ray and the host per sync, and the first sync never finished)."""
    import ray

    cfg = compose_cfg([*SCALE_OUT, f"placement.ray_address={two_nodes}", "trainer.batching.micro_batch_size=4"])
    nodes: set[str] = set()
    gathered_here = ShardedPolicy.named_weights

    def not_during_a_sync(self: ShardedPolicy):
        assert not any(frame.function == "push" for frame in inspect.stack()), "a sync gathered the weights here"
        return gathered_here(self)

    monkeypatch.setattr(ShardedPolicy, "named_weights", not_during_a_sync)

    def where_everything_ran(parts: Components) -> None:
        actors = parts.placement._actors + parts.trainer.workers
        nodes.update(ray.get([a.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id()) for a in actors]))

    stats = train_sync_and_compare(cfg, tmp_path / "saved", before_close=where_everything_ran, push_every_step=True)
    assert stats.bytes_moved > 0 and stats.gather_s > 0
    assert len(nodes) == 2  # engines and trainer ranks spread over both nodes


def test_scale_out_config_errors_come_before_anything_loads(compose_cfg) -> None:
    with pytest.raises(ConfigError) as caught:
        build(compose_cfg([*SCALE_OUT, "rollout.layout.tensor_parallel_size=2", "placement.ray_address=127.0.0.1:1"]))
    message = str(caught.value)
    assert "placement.ray_address='127.0.0.1:1': no Ray cluster answers there" in message
    assert "rollout.layout.tensor_parallel_size=2: tensor parallelism spreads one replica over GPUs" in message
    with pytest.raises(ConfigError, match="trainer.world_size=2 with placement=colocated: .* use placement=split"):
        build(compose_cfg(["trainer=fsdp", "weight_bridge=reload"]))
    with pytest.raises(ConfigError, match=r"trainer.optimisation.lr='abc': expected a number"):
        build(compose_cfg([*SCALE_OUT, "trainer.optimisation.lr=abc"]))


def test_too_few_gpus_names_every_consumer() -> None:
    needs = {"engines": 4, "the trainer (trainer.world_size x gpus_per_rank)": 8}
    assert gpu_problems(needs, available=8) == [
        "this placement needs 12 GPUs (engines 4, the trainer (trainer.world_size x gpus_per_rank) 8) and this machine has 8"
    ]
    assert gpu_problems(needs, available=12) == []


def test_prompts_are_balanced_by_completions_across_replicas() -> None:
    assert _shares([4] * 8, 2) == [(0, 4), (4, 8)]
    assert _shares([8, 1, 1, 1, 1, 1, 1, 1, 1], 2) == [(0, 1), (1, 9)]  # one heavy prompt is a share of its own
    assert _shares([2, 2], 3) == [(0, 0), (0, 1), (1, 2)]  # more replicas than prompts: some idle


@contextmanager
def _driven_cluster(nodes: int) -> Iterator[Any]:
    """A head that takes no work and `nodes` one-CPU nodes. This process joins while the head is the only node, so it
    is the head's driver: Ray refuses to take down the node a driver is attached to, and with several nodes on one host
    it would attach to any of them."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    ray.init(address=cluster.address)
    for _ in range(nodes):
        cluster.add_node(num_cpus=1)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture
def engine_nodes() -> Iterator[Any]:
    """Two one-CPU nodes under a head that takes no work: an engine replica fits on either, one at a time."""
    with _driven_cluster(nodes=2) as cluster:
        yield cluster


def _remove_the_engines_node(cluster: Any, removed: list[str]) -> None:
    """Take down the node the engine replica runs on, as a lost machine."""
    import ray

    (actor,) = [ray.get_actor(a["name"], namespace=a["namespace"]) for a in ray.util.list_named_actors(all_namespaces=True)
                if a["name"].startswith("grpo_pipe-engine-")]
    node_id = ray.get(actor.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id()))
    (node,) = [n for n in cluster.list_all_nodes() if n.node_id == node_id]
    removed.append(node_id)
    cluster.remove_node(node)


@pytest.mark.slow
def test_a_node_that_dies_under_an_engine_replica_is_replaced_on_the_surviving_node(
    compose_cfg, engine_nodes: Any, tmp_path: Path
) -> None:
    from mlflow.tracking import MlflowClient

    cfg = compose_cfg(["placement=split", "weight_bridge=nccl", f"placement.ray_address={engine_nodes.address}",
                       "trainer.steps=4", "checkpoint.every=1", "placement.restart_backoff_s=0.1"])
    removed: list[str] = []
    with once_it_exists(tmp_path / "checkpoints" / "step-000002", lambda: _remove_the_engines_node(engine_nodes, removed)):
        result = run(cfg, JobContext(output_dir=tmp_path, run_name="node-lost"))
    assert len(removed) == 1  # the engine's node went down mid-run; the head takes no work, so the
    # replacement below ran on the one node left
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    assert client.get_run(result.run_id).info.status == "FINISHED"
    restarts = [m.value for m in client.get_metric_history(result.run_id, "engine/restarts")]
    assert restarts[-1] == 1.0  # replaced once, on the one node left that has room
    versions = [m.value for m in client.get_metric_history(result.run_id, "policy/version")]
    assert versions == [1.0, 2.0, 3.0, 4.0]  # every step trained: the lost requests were issued again
    assert result.ledger.balanced() and not result.ledger.dropped


@pytest.fixture
def rank_nodes() -> Iterator[Any]:
    """Three one-CPU nodes under a head that takes no work: the engine replica and each of the two trainer ranks get a
    node of their own."""
    with _driven_cluster(nodes=3) as cluster:
        yield cluster


def _remove_rank_1s_node(cluster: Any, removed: list[float]) -> None:
    """Take down the node that holds trainer rank 1 (bundle 1 of the trainer's placement group)."""
    import ray

    (group,) = [g for g in ray.util.placement_group_table().values() if len(g["bundles"]) == 2 and g["state"] == "CREATED"]
    (node,) = [n for n in cluster.list_all_nodes() if n.node_id == group["bundles_to_node_id"][1]]
    removed.append(time.monotonic())
    cluster.remove_node(node)


@pytest.mark.slow
def test_a_node_that_dies_under_a_trainer_rank_stops_the_run_at_once_with_its_last_checkpoint(
    compose_cfg, rank_nodes: Any, tmp_path: Path
) -> None:
    from mlflow.tracking import MlflowClient

    from grpo_pipe.checkpoint.store import Checkpoint
    from grpo_pipe.trainer.errors import TrainerLost

    cfg = compose_cfg(["placement=split", "trainer=fsdp", "trainer.world_size=2", "weight_bridge=nccl",
                       f"placement.ray_address={rank_nodes.address}", "trainer.steps=8", "checkpoint.every=1"])
    removed: list[float] = []
    with once_it_exists(tmp_path / "checkpoints" / "step-000002", lambda: _remove_rank_1s_node(rank_nodes, removed)):
        with pytest.raises(TrainerLost, match="trainer rank 1 of 2 died"):
            run(cfg, JobContext(output_dir=tmp_path, run_name="rank-lost"))
        stopped = time.monotonic()
    assert len(removed) == 1
    # Not the process group's timeout (trainer.timeout_s, 300 s): the dead rank is noticed by Ray, then all stops.
    assert stopped - removed[0] < 120
    saved = sorted((tmp_path / "checkpoints").glob("step-*"))
    assert saved and 2 <= Checkpoint(saved[-1]).step < 8  # the run stopped part-way, with a checkpoint at least at step 2
    assert all(not Checkpoint(path).problems() for path in saved)  # every checkpoint left whole: resume=latest takes it
    assert all(Checkpoint(path).sharded for path in saved)  # written by the ranks, never gathered into the run's process
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    [tracked] = client.search_runs([client.get_experiment_by_name("grpo_pipe").experiment_id])
    assert tracked.info.status == "FAILED"
    assert tracked.data.tags["grpo_pipe.last_checkpoint_step"] == str(Checkpoint(saved[-1]).step)
