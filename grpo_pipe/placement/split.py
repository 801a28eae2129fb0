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
import time
import uuid
from typing import Any

import torch

from grpo_pipe.interfaces import RolloutEngine
from grpo_pipe.rollout.errors import EngineGaveUp
from grpo_pipe.rollout.ray_engine import UPDATES, EngineHost, RayEngineFleet, explicit_log_levels
from grpo_pipe.rollout.vllm_engine import VllmEngine

log = logging.getLogger(__name__)


class SplitPlacement:
    sleep_level = 0  # the replicas own their devices: nothing needs to sleep

    def __init__(
        self,
        num_engines: int = 1,
        engine_cpus: int = 1,
        engine_gpus: int = 1,
        ray_address: str | None = None,
        host: str = "127.0.0.1",
        max_restarts: int = 3,
        restart_backoff_s: float = 2.0,
    ) -> None:
        if num_engines < 1 or engine_cpus < 1 or engine_gpus < 0:
            raise ValueError(
                f"placement.num_engines={num_engines} and engine_cpus={engine_cpus} must be >= 1, "
                f"engine_gpus={engine_gpus} >= 0"
            )
        self.num_engines = num_engines
        self.engine_cpus = engine_cpus
        self.engine_gpus = engine_gpus
        self.ray_address = ray_address
        self.host = host
        self.max_restarts = max_restarts  # engine deaths survived per run; one more stops the run
        self.restart_backoff_s = restart_backoff_s  # doubled after every restart
        self.fleet: RayEngineFleet | None = None
        self._actors: list[Any] = []
        self._owns_ray = False

    def place(self, engine: RolloutEngine) -> RolloutEngine:
        if not isinstance(engine, VllmEngine):
            raise TypeError(f"placement=split runs rollout=vllm engines in Ray actors, got {type(engine).__name__}")
        self.fleet = RayEngineFleet(engine, self._start_actors)
        return self.fleet

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
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()
            self._owns_ray = False

    def _start_actors(self, template: VllmEngine) -> list[Any]:
        import ray

        self._ensure_ray()
        for old in self._actors:  # a restart: whatever is left of the previous replicas goes
            ray.kill(old)
        gpus = self.engine_gpus if torch.cuda.is_available() else 0
        # Weight syncs get a concurrency group of their own, so they reach a replica while it generates.
        host = ray.remote(
            num_cpus=self.engine_cpus, num_gpus=gpus, max_restarts=0, concurrency_groups={UPDATES: 1}
        )(EngineHost)
        run_tag = uuid.uuid4().hex[:8]
        self._actors = [
            host.options(name=f"grpo_pipe-engine-{i}-{run_tag}").remote(template, explicit_log_levels())
            for i in range(self.num_engines)
        ]
        return self._actors

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
            ray.init(
                num_cpus=max(os.cpu_count() or 1, needed),
                include_dashboard=False,
                _node_ip_address=self.host,
                log_to_driver=True,
            )
        self._owns_ray = True


def _visible_gpu_ids() -> list[int]:
    """Physical ids of the GPUs this process sees, in its own index order (Ray reports physical ids)."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed:
        return [int(x) for x in listed.split(",") if x.strip()]
    return list(range(torch.cuda.device_count()))
