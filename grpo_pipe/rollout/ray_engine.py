"""vLLM engines in Ray actors, driven from the trainer's process as one `RolloutEngine`.

Each replica is an actor holding a `VllmEngine` on its own devices, its engine core in the actor's
process unless `rollout.layout.in_process=false` gives the core a process of its own.
Ray runs an actor's calls one at a time, in the order the caller made them, with one exception: the
calls of a weight sync (`call_workers`, `after_external_weight_update`, `set_served_version`) and the
`is_generating` probe run in a concurrency group of their own, so a sync reaches a replica while it
generates. The engine applies it between two steps: running requests go on with the new weights and
their tokens are attributed to the versions that produced them (in_flight.py). A generation submitted
after a sync returned runs on the new weights. Prompts are split into contiguous shares across
replicas and the answers are put back in prompt order.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from grpo_pipe.rollout.errors import EngineLost
from grpo_pipe.rollout.vllm_engine import VllmEngine
from grpo_pipe.runtime.halt import halt_point
from grpo_pipe.types import GeneratedBatch, SamplingSettings

log = logging.getLogger(__name__)

# The actors' concurrency group for weight syncs: a sync runs beside a generation call (the engine applies
# it between two steps, see in_flight.py); everything else runs one call at a time, in call order.
UPDATES = "updates"


class EngineHost:
    """The actor's body: one `VllmEngine` living in the actor's process.

    Args:
        engine: The engine this actor holds, not yet connected (`connect` loads the model).
        log_levels: Levels by logger name, set in the actor's process: the driver's logging config does not reach it.
    """

    def __init__(self, engine: VllmEngine, log_levels: dict[str, int]) -> None:
        if engine.layout.in_process is None:
            engine.in_process = True  # by default the core runs in the actor's process: no further process
        # else `rollout.layout.in_process=false`: a core process of its own (vLLM's fastest layout on a GPU); syncs
        # still land mid-generation, through vLLM's pause/resume (in_flight.py)
        self.engine = engine
        self.worker_calls: Counter[str] = Counter()  # calls so far by method: the n of a test's hold point
        for name, level in log_levels.items():
            logging.getLogger(name).setLevel(level)

    def connect(self, model_path: str, options: dict[str, Any] | None) -> None:
        self.engine.connect(Path(model_path), options)

    def submit(self, prompts: list[list[int]], samples: list[int], sampling: SamplingSettings) -> GeneratedBatch:
        return self.engine.submit(prompts, samples, sampling).result()  # the actor's call is what runs beside training

    def set_served_version(self, version: int) -> None:
        self.engine.served_version = version

    def is_generating(self) -> bool:
        return self.engine.is_generating()

    def generation_steps(self) -> int:
        return self.engine.generation_steps()

    def call_workers(self, method: str, args: tuple[Any, ...], timeout_s: float | None) -> list[Any]:
        self.worker_calls[method] += 1
        # A test's kill point inside a sync (`grpo_receive_weights@2`: the trainer sending, this replica not yet
        # receiving); a no-op otherwise.
        halt_point(method, self.worker_calls[method])
        return self.engine.call_workers(method, *args, timeout_s=timeout_s)

    def after_external_weight_update(self) -> None:
        self.engine.after_external_weight_update()

    def use_adapter(self, name: str, adapter_id: int, folder: str) -> None:
        self.engine.use_adapter(name, adapter_id, Path(folder))

    def retire_adapter(self, adapter_id: int) -> None:
        self.engine.retire_adapter(adapter_id)

    def sleep(self, level: int) -> None:
        self.engine.sleep(level)

    def wake_up(self) -> None:
        self.engine.wake_up()

    def shutdown(self) -> None:
        self.engine.shutdown()

    def where(self) -> dict[str, Any]:
        """The actor's process id and the GPU ids Ray gave it (physical ids as the driver sees them)."""
        import ray

        return {"pid": os.getpid(), "gpu_ids": [int(g) for g in ray.get_gpu_ids()]}


@dataclass
class PendingFleetRollout:
    """One generation call spread over the replicas; `result()` waits and restores prompt order.

    Args:
        refs: One Ray ObjectRef per replica that got prompts.
    """

    refs: list[Any]

    def result(self) -> GeneratedBatch:
        parts: list[GeneratedBatch] = _get(self.refs)
        completions = [group for part in parts for group in part.completions]
        return GeneratedBatch(completions, min(p.started_s for p in parts), max(p.finished_s for p in parts))


class RayEngineFleet:
    """`num_engines` replicas of one engine spec, each in its own Ray actor.

    Args:
        template: The engine spec every replica is built from.
        start_actors: Starts the replicas' actors from the spec and returns their handles: the placement decides where
            they go (and kills old ones).
    """

    in_process = False  # the engines' models live in other processes

    def __init__(self, template: VllmEngine, start_actors: Callable[[VllmEngine], list[Any]]) -> None:
        self.template = template
        self._start_actors = start_actors
        self.actors: list[Any] = []
        self.model_path: Path | None = None
        self._options: dict[str, Any] | None = None
        self._version = 0
        self._running = False

    @property
    def max_model_len(self) -> int:
        return self.template.max_model_len

    @property
    def weight_dtype(self) -> torch.dtype:
        return self.template.weight_dtype

    @property
    def enable_sleep_mode(self) -> bool:
        return self.template.memory.enable_sleep_mode

    @property
    def served_version(self) -> int:
        return self._version

    @served_version.setter
    def served_version(self, version: int) -> None:
        self._version = version
        self._all("set_served_version", version, group=UPDATES)

    def connect(self, model_path: Path, options: dict[str, Any] | None = None) -> None:
        if not self.actors:
            self.actors = self._start_actors(self.template)
        started = time.perf_counter()
        if options is not None:
            self._options = dict(options)
        self._all("connect", str(model_path), self._options)
        self.model_path, self._running = Path(model_path), True
        self._all("set_served_version", self._version)
        log.info("%d engine replica(s) up in Ray actors in %.1fs", len(self.actors), time.perf_counter() - started)

    def generate(
        self, prompts: Sequence[Sequence[int]], samples: Sequence[int], sampling: SamplingSettings
    ) -> list[list[Any]]:
        return self.submit(prompts, samples, sampling).result().completions

    def submit(
        self, prompts: Sequence[Sequence[int]], samples: Sequence[int], sampling: SamplingSettings
    ) -> PendingFleetRollout:
        refs = []
        for actor, (lo, hi) in zip(self.actors, _shares(samples, len(self.actors))):
            if hi > lo:
                refs.append(actor.submit.remote([list(p) for p in prompts[lo:hi]], list(samples[lo:hi]), sampling))
        return PendingFleetRollout(refs)

    def call_workers(self, method: str, *args: Any, timeout_s: float | None = None) -> list[Any]:
        refs = [a.call_workers.options(concurrency_group=UPDATES).remote(method, args, timeout_s) for a in self.actors]
        return [r for per_actor in _get(refs, timeout_s) for r in per_actor]

    def after_external_weight_update(self) -> None:
        self._all("after_external_weight_update", group=UPDATES)

    def generating(self) -> list[bool]:
        """Per replica, whether a generation call is running (asked beside it, in the updates group)."""
        return self._all("is_generating", group=UPDATES)

    def generation_steps(self) -> list[int]:
        """Per replica, the engine steps its running generation call has taken (asked in the updates group)."""
        return self._all("generation_steps", group=UPDATES)

    def use_adapter(self, name: str, adapter_id: int, folder: Path) -> None:
        self._all("use_adapter", name, adapter_id, str(folder))

    def retire_adapter(self, adapter_id: int) -> None:
        self._all("retire_adapter", adapter_id)

    def sleep(self, level: int) -> None:
        self._all("sleep", level)

    def wake_up(self) -> None:
        self._all("wake_up")

    def shutdown(self) -> None:
        """Stop the engines; the actors stay (a checkpoint bridge restarts engines in them)."""
        if self._running:
            self._all("shutdown")
            self._running = False

    def is_running(self) -> bool:
        return self._running

    def restart(self) -> None:
        """New actors on the model the engines were started on; the caller re-syncs the weights."""
        if self.model_path is None:
            raise RuntimeError("restart() before connect()")
        self.actors, self._running = [], False
        self.connect(self.model_path)

    def worker_count(self) -> int:
        return len(self.actors) * self.template.worker_count()  # every tensor-parallel rank of every replica

    def where(self) -> list[dict[str, Any]]:
        import ray

        return ray.get([a.where.remote() for a in self.actors])

    def _all(self, method: str, *args: Any, group: str | None = None) -> list[Any]:
        calls = [getattr(a, method) for a in self.actors]
        if group is not None:
            calls = [call.options(concurrency_group=group) for call in calls]
        return _get([call.remote(*args) for call in calls])


def _get(refs: list[Any], timeout_s: float | None = None) -> list[Any]:
    """ray.get, with a dead actor reported as EngineLost (the runner restarts engines on that)."""
    import ray
    from ray.exceptions import RayActorError

    try:
        return ray.get(refs, timeout=timeout_s)
    except RayActorError as err:
        raise EngineLost(f"an engine actor died: {err}") from err


def _shares(samples: Sequence[int], parts: int) -> list[tuple[int, int]]:
    """Contiguous [lo, hi) prompt ranges over `parts` replicas, balanced by completions to generate
    (a prompt asking for 8 samples weighs 8), so no replica is left with most of the work."""
    total, bounds, lo = sum(samples), [], 0
    cumulative = 0
    for i in range(parts):
        target = total * (i + 1) / parts
        hi = lo
        # take prompts while that brings this share closer to its target, leaving one prompt per later replica
        while hi < len(samples) - (parts - 1 - i) and abs(cumulative + samples[hi] - target) <= abs(cumulative - target):
            cumulative += samples[hi]
            hi += 1
        if i == parts - 1:
            cumulative += sum(samples[hi:])
            hi = len(samples)
        bounds.append((lo, hi))
        lo = hi
    return bounds


def explicit_log_levels(prefix: str = "vllm") -> dict[str, int]:
    """Levels set in this process's logging config for `prefix` loggers, to apply in actors too."""
    levels = {}
    for name, logger in logging.root.manager.loggerDict.items():
        if name.startswith(prefix) and isinstance(logger, logging.Logger) and logger.level != logging.NOTSET:
            levels[name] = logger.level
    return levels
