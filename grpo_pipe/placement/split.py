"""Engine and trainer apart: every engine replica runs in its own Ray actor on its own device(s)
(on a CPU machine: its own process and CPU threads); the trainer keeps this process and a GPU that
no replica got. Nothing sleeps, since neither side needs the other's memory; the two overlap in
time when the async loop lets generation run ahead of training (`rollout_scheduler.max_staleness`).

Ray is the process and cluster manager here: it starts, places and stops the replicas, on this
machine (a local Ray instance bound to 127.0.0.1, no dashboard) or on a cluster (`ray_address`).
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from typing import Any

import torch

from grpo_pipe.config.dependencies import ray_problems
from grpo_pipe.config.errors import failed
from grpo_pipe.interfaces import RolloutEngine
from grpo_pipe.placement.resources import ShardedTraining, gpu_problems
from grpo_pipe.rollout.errors import EngineGaveUp
from grpo_pipe.rollout.ray_engine import UPDATES, EngineHost, RayEngineFleet, explicit_log_levels
from grpo_pipe.rollout.vllm_engine import VllmEngine
from grpo_pipe.runtime.undertaker import Undertaker, fate_shared

log = logging.getLogger(__name__)


class SplitPlacement:
    """`placement=split`: each engine replica in its own Ray actor on its own device(s); the trainer keeps this process.

    Pair with `rollout_scheduler.max_staleness >= 1` so generation runs while the trainer trains.

    Args:
        num_engines: Engine replicas; prompts are split across them.
        engine_cpus: Ray CPUs per replica.
        engine_gpus: GPUs per replica (ignored on a CPU machine).
        ray_address: None = a local Ray instance on `host`; `"auto"` or `host:port` = an existing cluster.
        host: The address the local Ray instance binds to.
        max_restarts: Engine deaths survived per run (restart, re-sync weights, re-issue requests).
        restart_backoff_s: Wait before a restart, doubled each time.
    """

    sleep_level = 0  # the replicas own their devices: nothing needs to sleep

    def __init__(
        self,
        *,
        num_engines: int = 1,
        engine_cpus: int = 1,
        engine_gpus: int = 1,
        ray_address: str | None = None,
        host: str = "127.0.0.1",
        max_restarts: int = 3,
        restart_backoff_s: float = 2.0,
    ) -> None:
        self.num_engines = num_engines
        self.engine_cpus = engine_cpus
        self.engine_gpus = engine_gpus
        self.ray_address = ray_address
        self.host = host
        self.max_restarts = max_restarts  # engine deaths survived per run; one more stops the run
        self.restart_backoff_s = restart_backoff_s  # doubled after every restart
        self.fleet: RayEngineFleet | None = None
        self._actors: list[Any] = []
        self._group: Any = None  # the engines' Ray placement group: one bundle per replica
        self._tp = 1
        self._owns_ray = False
        self._undertaker: Undertaker | None = None  # watches the local Ray node this process starts (none on a cluster)

    def config_problems(self) -> list[str]:
        """Ray is an optional dependency: only this placement needs it."""
        return failed(
            (self.num_engines >= 1, f"placement.num_engines={self.num_engines}: must be >= 1"),
            (self.engine_cpus >= 1, f"placement.engine_cpus={self.engine_cpus}: must be >= 1"),
            (self.engine_gpus >= 0, f"placement.engine_gpus={self.engine_gpus}: must be >= 0"),
        ) + ray_problems("_target_: placement=split")

    def place(self, engine: RolloutEngine) -> RolloutEngine:
        if not isinstance(engine, VllmEngine):
            raise TypeError(f"placement=split runs rollout=vllm engines in Ray actors, got {type(engine).__name__}")
        self._tp = engine.layout.tensor_parallel_size
        self.fleet = RayEngineFleet(engine, self._start_actors)
        return self.fleet

    def check(self, trainer: object) -> list[str]:
        """What this machine or cluster cannot give (GPUs, a reachable Ray cluster); checked before anything loads."""
        problems = []
        if self.ray_address not in (None, "auto"):
            problems += _unreachable(self.ray_address)
        cuda = torch.cuda.is_available()
        if self._tp > 1 and not cuda:
            problems.append(
                f"rollout.layout.tensor_parallel_size={self._tp}: tensor parallelism spreads one replica over GPUs and "
                "this machine has none; on CPU add replicas instead (placement.num_engines)"
            )
        engine_gpus = self.num_engines * self.engine_gpus * self._tp if cuda else 0
        sharded = isinstance(trainer, ShardedTraining)
        trainer_gpus = trainer.gpus_needed(cuda) if sharded else int(cuda)  # type: ignore[union-attr]
        if self.ray_address is None:  # a cluster's GPUs are counted by Ray when the groups are reserved
            problems += gpu_problems(
                {"engines (placement.num_engines x engine_gpus x rollout.layout.tensor_parallel_size)": engine_gpus,
                 "the trainer" + (" (trainer.world_size x gpus_per_rank)" if sharded else ""): trainer_gpus},
                torch.cuda.device_count() if cuda else 0,
            )
        return problems

    def trainer_device(self) -> torch.device:
        """A GPU no replica was given (valid once the engines are up), else the CPU."""
        if not torch.cuda.is_available():
            return torch.device("cpu")
        taken = {g for w in (self.fleet.where() if self.fleet else []) for g in w["gpu_ids"]}
        visible = _visible_gpu_ids()
        for index, physical in enumerate(visible):
            if physical not in taken:
                return torch.device("cuda", index)
        raise RuntimeError(
            f"placement=split: the engines took every GPU ({sorted(taken)}); the trainer needs one more "
            f"(lower placement.num_engines or placement.engine_gpus)"
        )

    def restart_engines(self, engine: RolloutEngine, attempt: int) -> None:
        """Replace dead replicas after a back-off; the runner then re-syncs weights and re-issues requests."""
        if attempt > self.max_restarts:
            raise EngineGaveUp(f"the engine died {attempt} times; placement.max_restarts={self.max_restarts}")
        delay = self.restart_backoff_s * 2 ** (attempt - 1)
        log.warning("Engine lost; restarting it in %.1fs (restart %d of at most %d)", delay, attempt, self.max_restarts)
        time.sleep(delay)
        assert self.fleet is not None
        self.fleet.restart()

    def before_rollout(self, engine: RolloutEngine) -> None:
        pass  # the engines keep their own memory: nothing to wake

    def before_train(self, engine: RolloutEngine) -> None:
        pass

    def before_sync(self, engine: RolloutEngine) -> None:
        pass

    def close(self) -> None:
        import ray

        if self.fleet is not None:
            try:
                self.fleet.shutdown()
            except Exception as err:  # an actor may already be dead; killing it below is what matters
                log.warning("engine shutdown in its actor failed: %r", err)
        for actor in self._actors:
            ray.kill(actor)
        self._actors = []
        self._release_group()
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()
            self._owns_ray = False
        if self._undertaker is not None:  # only after a shutdown that worked: else the node is still its to stop
            self._undertaker.dismiss()
            self._undertaker = None

    def _start_actors(self, template: VllmEngine) -> list[Any]:
        """One actor per replica, each in its own bundle of a placement group (replica GPUs = engine_gpus x TP),
        so Ray accounts for every engine GPU, on one machine or across a cluster."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self._ensure_ray()
        for old in self._actors:  # a restart: whatever is left of the previous replicas goes
            ray.kill(old)
        self._release_group()
        gpus = self.engine_gpus * self._tp if torch.cuda.is_available() else 0
        bundle: dict[str, float] = {"CPU": self.engine_cpus, **({"GPU": gpus} if gpus else {})}
        self._group = ray.util.placement_group([bundle] * self.num_engines, strategy="PACK")
        if not self._group.wait(timeout_seconds=120):
            raise RuntimeError(
                f"placement.num_engines={self.num_engines}: Ray could not reserve {bundle} per replica "
                f"(free now: {ray.available_resources()})"
            )
        # Weight syncs get a concurrency group of their own, so they reach a replica while it generates.
        # (ray.remote's typed overloads leave out concurrency_groups, which it takes for actor classes.)
        host = ray.remote(  # pyright: ignore[reportCallIssue]
            num_cpus=self.engine_cpus, num_gpus=gpus, max_restarts=0, concurrency_groups={UPDATES: 1}
        )(EngineHost)
        run_tag = uuid.uuid4().hex[:8]
        self._actors = [
            host.options(
                name=f"grpo_pipe-engine-{i}-{run_tag}",
                scheduling_strategy=PlacementGroupSchedulingStrategy(self._group, placement_group_bundle_index=i),
            ).remote(template, explicit_log_levels())
            for i in range(self.num_engines)
        ]
        return self._actors

    def _release_group(self) -> None:
        import ray

        if self._group is not None and ray.is_initialized():
            ray.util.remove_placement_group(self._group)
        self._group = None

    def _ensure_ray(self) -> None:
        import ray

        if ray.is_initialized():
            return
        if self.ray_address is not None:
            ray.init(address=self.ray_address, log_to_driver=True)
        else:
            # Logical CPUs: enough for every replica even on a 2-core machine (Ray would otherwise
            # leave an actor pending forever); the OS shares the real cores.
            needed = self.num_engines * self.engine_cpus + 1
            # The undertaker stops the node's processes if this one is killed: Ray's agents would outlive it a minute.
            _, self._undertaker = fate_shared(lambda: ray.init(
                address="local",  # a private instance: never join whatever cluster `ray start` left on this machine
                num_cpus=max(os.cpu_count() or 1, needed),
                include_dashboard=False,
                _node_ip_address=self.host,
                log_to_driver=True,
            ))
        self._owns_ray = True


def _unreachable(address: str) -> list[str]:
    """A cluster address nothing answers at (host:port of the Ray head's GCS), found in seconds."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=5.0):
            return []
    except (OSError, ValueError) as err:
        return [f"placement.ray_address={address!r}: no Ray cluster answers there ({err}); "
                "start one (`ray start --head`) or use null for a local instance"]


def _visible_gpu_ids() -> list[int]:
    """Physical ids of the GPUs this process sees, in its own index order (Ray reports physical ids)."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed:
        return [int(x) for x in listed.split(",") if x.strip()]
    return list(range(torch.cuda.device_count()))
