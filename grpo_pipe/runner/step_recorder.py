"""The bookkeeping beside the recipe: counters, time spans and metric merges, so `train_step` reads as
the algorithm. One `begin`/`end` pair per step; what the whole loop accumulates becomes the run summary."""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from grpo_pipe.environments.metrics import episode_metrics
from grpo_pipe.interfaces import RolloutSource
from grpo_pipe.runner import step_metrics
from grpo_pipe.runner.run_totals import OverlapMeter, SamplesTable, StepTimes
from grpo_pipe.trainer.memory import memory_metrics
from grpo_pipe.types import RewardOutput, RolloutGroup, SyncStats, TakenBatch

log = logging.getLogger(__name__)

# The parts of a step, in order: getting the batch (waiting for it included), scoring it, the curriculum's
# update, handing the device to the trainer, the optimizer update, the weight sync, scheduling the engine's
# next work (an engine in this process generates it there and then); and the whole step.
PHASES = {"rollouts_s": "time/rollouts_s", "reward_s": "time/reward_s", "curriculum_s": "time/curriculum_s",
          "placement_s": "time/placement_s", "train_s": "time/train_s", "sync_s": "sync/total_s",
          "schedule_s": "time/schedule_s", "step_s": "time/step_s"}


class MismatchWatch:
    """Warns once when an on-policy batch's trainer/sampler log-prob mismatch passes a threshold, naming the bridge:
    both sides should hold the same weights then, so a large mismatch means a sync that did not land (or numerics
    far apart), which would otherwise only show as slow learning.

    Args:
        threshold: The mean per-token log-prob gap above which it warns (`run.mismatch_warn`); None: never.
        bridge: The weight bridge's name, named in the warning.
    """

    def __init__(self, threshold: float | None, bridge: str) -> None:
        self.threshold = threshold
        self.bridge = bridge
        self.warned = False

    def check(self, step: int, metrics: Mapping[str, float], on_policy: bool) -> None:
        value = metrics.get(MISMATCH_KEY)
        if self.warned or self.threshold is None or not on_policy or value is None or value <= self.threshold:
            return
        self.warned = True
        log.warning(
            "Step %d: the engine's log-probs differ from the trainer's on the same weights by %.4f per token on "
            "average (run.mismatch_warn=%s; max %.3f, KL %.4f). Suspect the weight bridge (%s): does the engine serve the "
            "trainer's weights after a sync? Or the two sides' dtypes: a bf16 engine beside a trainer computing in fp32 "
            "(trainer.precision.autocast resolves to none on a CPU) serves only the updates larger than bf16's rounding "
            "step, so the gap grows as the trainer learns; trainer.precision.autocast=bfloat16 scores with the weights "
            "the engine serves (BENCHMARKS.md, 'bf16 mismatch on a CPU'). Warned once; the mismatch/* metrics show "
            "every step.",
            step, value, self.threshold, metrics.get("mismatch/logprob_abs_max", float("nan")),
            metrics.get("mismatch/kl_k3", float("nan")), self.bridge,
        )


MISMATCH_KEY = "mismatch/logprob_abs_mean"


class StepRecorder:
    """What one step produced (as metrics), and what the loop in this process accumulates.

    Args:
        samples_to_log: Completions per step kept for the samples table.
        mismatch: Warns when an on-policy batch's log-prob mismatch is too large; None: one that never warns.
        samples_file: Where the samples table is appended step by step; None: the rows stay in memory.
    """

    def __init__(self, samples_to_log: int, mismatch: MismatchWatch | None = None,
                 samples_file: Path | None = None) -> None:
        self.samples_to_log = samples_to_log
        self.mismatch = mismatch or MismatchWatch(None, "")
        self.on_policy = False  # every completion of this step's batch came from the weights the trainer holds
        self.step_rewards: list[float] = []  # mean reward per step, from step 1 (restored on resume)
        self.overlap = OverlapMeter()  # wall clock: trainer busy, engine busy (from the scheduler's spans), both
        self.wait_s = 0.0  # trainer time spent waiting for rollouts
        self.samples_table = SamplesTable(samples_file)  # on disk when given a file: nothing kept per step here
        # This process's loop only, like train_spans: samples trained on, and those new weights reached mid-way.
        self.samples = 0
        self.samples_updated_in_flight = 0
        self.step_times = StepTimes()  # each step of this process's loop, by PHASES' names (bounded)
        self._metrics: dict[str, float] = {}
        self._started = 0.0
        self.trainer_device: torch.device | None = None  # where the memory figures are read; None: none read here

    @property
    def table(self) -> list[dict[str, Any]]:
        """The samples table's rows (read back from its file): for the end of the run, not for every step."""
        return self.samples_table.rows()

    def begin(self) -> None:
        self._metrics = {}
        self._started = time.perf_counter()

    def waited(self, taken: TakenBatch) -> None:
        """A batch came back from the scheduler (also one whose every group was dropped)."""
        self.wait_s += taken.wait_s

    def rollouts(self, taken: TakenBatch, dropped: int, scheduler: RolloutSource, trainer_version: int) -> None:
        """The batch trained on this step; `dropped` counts groups discarded as too stale on the way."""
        self.take_generation_spans(scheduler)
        completions = [c for g in taken.groups for c in g.completions]
        self.on_policy = all(c.policy_version == trainer_version and not c.version_switches for c in completions)
        self.samples += len(completions)
        self.samples_updated_in_flight += sum(bool(c.version_switches) for c in completions)
        gen_s = taken.generated.finished_s - taken.generated.started_s
        self.add(step_metrics.rollout_metrics(taken.groups, gen_s))
        self.add(episode_metrics([g.completions for g in taken.groups]))  # nothing for single-turn rollouts
        # Only a loop that runs ahead has staleness, queues and drops: in a synchronous one they are charts of zeros.
        if scheduler.max_staleness > 0 or scheduler.stale_policy == "drop":
            self.add(step_metrics.async_metrics(taken, dropped, scheduler))

    def scores(self, step: int, groups: Sequence[RolloutGroup], scored: RewardOutput) -> None:
        self.add(step_metrics.reward_metrics(scored))
        self.samples_table.extend(step_metrics.sample_rows(step, groups, scored, self.samples_to_log))

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Times one part of the step as `time/<name>_s`."""
        started = time.perf_counter()
        yield
        self.add({f"time/{name}_s": time.perf_counter() - started})

    @contextmanager
    def training(self) -> Iterator[None]:
        """Times the optimizer update (for the overlap summary) and records memory after it."""
        started = time.time()  # wall clock, as the engine's generation spans are
        with self.phase("train"):
            yield
        self.overlap.add_train((started, time.time()))
        self.add(memory_metrics(self.trainer_device))

    def synced(self, stats: SyncStats | None) -> None:
        if stats is not None:
            self.add(stats.as_metrics())

    def add(self, metrics: Mapping[str, float] | None) -> None:
        self._metrics.update(metrics or {})

    def end(self, step: int, policy_version: int, engine_restarts: int) -> dict[str, float]:
        """This step's metrics; its mean reward joins the run's reward curve."""
        metrics = self._metrics
        self.mismatch.check(step, metrics, self.on_policy)
        metrics["policy/version"] = float(policy_version)
        metrics["engine/restarts"] = float(engine_restarts)
        metrics["time/step_s"] = time.perf_counter() - self._started
        self.step_times.add({name: metrics[key] for name, key in PHASES.items() if key in metrics})
        self.step_rewards.append(metrics["train/reward/mean"])
        return metrics

    def take_generation_spans(self, scheduler: RolloutSource) -> None:
        """The engine's busy spans since the last call, folded into the overlap figures; the scheduler's list is
        emptied, so neither side keeps a span per step."""
        spans = scheduler.generation_intervals
        self.overlap.add_generation(spans)
        del spans[:]

    def summary(self, scheduler: RolloutSource, loop_s: float) -> dict[str, float]:
        """The end-of-run numbers: reward quarters, generation/training overlap, in-flight updates."""
        self.take_generation_spans(scheduler)
        times = self.step_times
        return {
            **step_metrics.quarter_summary(self.step_rewards),
            **step_metrics.overlap_summary(scheduler, self.overlap, self.wait_s, loop_s),
            "summary/in_flight_updated_fraction": self.samples_updated_in_flight / max(self.samples, 1),
            "summary/step_s": times.total_step_s / max(times.count, 1),
            "summary/first_step_s": times.first["step_s"] if times.first else 0.0,  # warm-up
            **self.phase_summary(),
        }

    def phase_summary(self) -> dict[str, float]:
        """Median seconds per step of each phase, as `summary/phase/<phase>`. The first step also waits for
        the first batch and warms up, so it is left out when there are three steps or more."""
        steps = self.step_times.for_medians()
        return {f"summary/phase/{name}": statistics.median(s.get(name, 0.0) for s in steps)
                for name in PHASES if any(name in s for s in steps)}
