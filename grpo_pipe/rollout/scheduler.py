"""Async rollouts with bounded staleness: generation runs ahead of training, never too far.

A batch submitted now is generated with the latest *pushed* weights (engines apply calls in
order) and trained on after every batch already in flight, so when it is trained the trainer is at
least `trainer_version + in_flight` and the sample's lag is at most

    staleness = trainer_version + in_flight - pushed_version

`pace` (the default) submits only while that stays <= `max_staleness`: no sample ever exceeds
the bound and none is wasted; `max_staleness=0` is exactly the synchronous loop (generate, train,
sync, generate...). `drop` keeps `max_staleness + 2` batches in flight whatever the syncs do, so the
engine never waits for the trainer, and discards (and counts) the groups that arrive too old.
Dropping biases training toward prompts that are answered fast, which is why pacing is the default.

Every group is accounted for exactly once: trained, dropped (with the reason), or still in flight
when the run ended (`ledger`, and by group id in `groups`, both kept with every checkpoint).

Batches in flight at a checkpoint (generated, or being generated, not yet trained) are, on resume, either kept
(`in_flight_on_resume=keep`, the default) or dropped and counted (`drop`). Kept batches are saved as their tasks and
generated again after the resume with their own seeds, on the checkpoint's weights (never older than the ones that
were sampling them), then trained: the run trains the very tasks, in the very order, that an uninterrupted run does,
and the curriculum's draws are not skewed by where a kill fell. Their completions themselves are not saved: at a
checkpoint the newest batch is usually still being generated, and waiting for it would stall every checkpoint by a
generation. `drop` is for an operator who wants no sample after a resume older than the resume itself; the dropped
groups are counted (`ledger/dropped`, reason `in flight at the checkpoint`) and named in one log line.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from grpo_pipe.data.prompts import a_few, cut_to
from grpo_pipe.environments.single_turn import SingleTurn
from grpo_pipe.interfaces import Environment, PendingRollout, RolloutEngine
from grpo_pipe.rollout.ledger import DROPPED, TRAINED, GroupRecord
from grpo_pipe.runtime.stopping import GenerationInterrupted
from grpo_pipe.types import Ledger, RolloutGroup, SamplingSettings, TakenBatch, Task, derive_seed

StalePolicy = Literal["pace", "drop"]
InFlightOnResume = Literal["keep", "drop"]
DROPPED_AT_RESUME = "in flight at the checkpoint (rollout_scheduler.in_flight_on_resume=drop)"
log = logging.getLogger(__name__)
# Batches in a row with no prompt that fits before a step is declared impossible (an error, not a loop).
MAX_EMPTY_BATCHES = 3


class NoTaskFits(RuntimeError):
    """No task of a step could be rolled out: every prompt drawn was longer than the engine allows."""


@dataclass(kw_only=True)
class _InFlight:
    index: int  # 1-based submission order
    tasks: list[Task]
    samples: list[int]  # [len(tasks)] completions asked for each task
    prompts: list[tuple[int, ...]]
    pending: PendingRollout


@dataclass(frozen=True, kw_only=True)
class RolloutSchedulerSettings:
    """The `rollout_scheduler` group: how far generation may run ahead of training, and what happens to a sample that
    would lag more. Its rules are stated here, beside the settings, and reported with every other config mistake
    before anything loads; `build` makes the scheduler once the engine, the tasks and the prompts exist.

    Args:
        max_staleness: Policy versions a trained sample may lag the trainer; 0 = the synchronous loop.
        stale_policy: `pace`: hold generation back within the bound; `drop`: discard a sample that lags more (and
            count it).
        in_flight_on_resume: Batches in flight at the checkpoint a run resumes from: `keep` (generated again from
            the same tasks, then trained) or `drop` (counted in the ledger, never trained).
    """

    max_staleness: int = 0
    stale_policy: StalePolicy = "pace"
    in_flight_on_resume: InFlightOnResume = "keep"

    def config_problems(self) -> list[str]:
        problems = []
        if self.max_staleness < 0:
            problems.append(f"max_staleness={self.max_staleness}: must be >= 0 (0 = on-policy, the synchronous loop)")
        if self.stale_policy not in ("pace", "drop"):
            problems.append(f"stale_policy={self.stale_policy!r}: allowed: 'pace', 'drop'")
        if self.in_flight_on_resume not in ("keep", "drop"):
            problems.append(f"in_flight_on_resume={self.in_flight_on_resume!r}: allowed: 'keep', 'drop'")
        return problems

    def build(self, engine: RolloutEngine, next_batch: Callable[[], list[tuple[Task, int]]],
              render: Callable[[Task], tuple[int, ...]], sampling: SamplingSettings, *, total_steps: int,
              prompt_limit: int | None, overlong_prompts: Literal["skip", "truncate"],
              environment: Environment) -> RolloutScheduler:
        return RolloutScheduler(engine=engine, next_batch=next_batch, render=render, sampling=sampling, total_steps=total_steps,
                                max_staleness=self.max_staleness, stale_policy=self.stale_policy,
                                prompt_limit=prompt_limit, overlong_prompts=overlong_prompts, environment=environment,
                                in_flight_on_resume=self.in_flight_on_resume)


@dataclass(kw_only=True, eq=False)
class RolloutScheduler:
    """The source of training batches the recipe builds from `RolloutSchedulerSettings` (`RolloutSource` in interfaces):
    see the module's description.

    Args:
        engine: The engine batches are generated on.
        next_batch: The next batch's tasks, each with its number of samples (the curriculum's choice).
        render: A task's prompt token ids (the environment's `render_prompt`).
        sampling: The run's sampling settings; each batch gets its own seed from them.
        total_steps: Training steps of the run: nothing is generated for a step past the last.
        max_staleness: Policy versions a trained sample may lag the trainer; 0 = the synchronous loop.
        stale_policy: `pace` or `drop`, as in `RolloutSchedulerSettings`.
        prompt_limit: Prompt tokens that leave room for the answer in the engine; None: no limit.
        overlong_prompts: A prompt over `prompt_limit` is skipped (and counted) or truncated from the left.
        environment: Turns prompts into completions (one engine call, or episodes with tools); not given: one turn
            (`SingleTurn`).
        in_flight_on_resume: `keep` or `drop`, as in `RolloutSchedulerSettings`.
    """

    engine: RolloutEngine
    next_batch: Callable[[], list[tuple[Task, int]]]
    render: Callable[[Task], tuple[int, ...]]
    sampling: SamplingSettings
    total_steps: int
    max_staleness: int
    stale_policy: StalePolicy
    prompt_limit: int | None = None
    overlong_prompts: Literal["skip", "truncate"] = "skip"
    environment: Environment = field(default_factory=SingleTurn)
    in_flight_on_resume: InFlightOnResume = "keep"
    ledger: Ledger = field(init=False, default_factory=Ledger)
    groups: GroupRecord = field(init=False, default_factory=GroupRecord)  # each group's outcome by id `<batch>.<position>`
    generation_intervals: list[tuple[float, float]] = field(init=False, default_factory=list)  # engine busy spans, wall clock
    # Wraps every wait on the engine; a stop signal may abandon it (StopRequest.interruptible).
    guard: Callable[[], contextlib.AbstractContextManager[None]] = field(init=False, default=contextlib.nullcontext)
    interrupted: str | None = field(init=False, default=None)  # set when a stop signal abandoned a generation
    _queue: deque[_InFlight] = field(init=False, default_factory=deque)
    _submitted: int = field(init=False, default=0)
    _last_finished: float | None = field(init=False, default=None)

    @property
    def in_flight(self) -> int:
        return len(self._queue)

    def fill(self, trainer_version: int, pushed_version: int, steps_done: int) -> int:
        """Submit every batch the policy allows now; returns how many were submitted.

        A stop signal during an in-process generation abandons that batch (never queued, so the ledger
        stays balanced) and returns; the next `take` then raises GenerationInterrupted."""
        count = 0
        try:
            while self.interrupted is None and self._may_submit(trainer_version, pushed_version, steps_done):
                self._submit()
                count += 1
        except GenerationInterrupted as stop:  # its tasks were never queued: a resume goes on with the next batch
            self.interrupted = str(stop)
        return count

    def _may_submit(self, trainer_version: int, pushed_version: int, steps_done: int) -> bool:
        if steps_done + len(self._queue) >= self.total_steps:
            return False  # everything still needed is already on its way
        if self.stale_policy == "pace":
            return trainer_version + len(self._queue) - pushed_version <= self.max_staleness
        return len(self._queue) < self.max_staleness + 2

    def _submit(self) -> None:
        self._submitted += 1
        for _ in range(MAX_EMPTY_BATCHES):  # a batch whose every prompt is too long is skipped whole
            batch = self._fit(self.next_batch())
            if batch:
                self._submit_batch(self._submitted, batch)
                return
        raise NoTaskFits(
            f"{MAX_EMPTY_BATCHES} batches in a row had no prompt of at most {self.prompt_limit} tokens "
            "(the engine's max_model_len minus the generation budget): nothing can be rolled out; "
            "lower run.max_new_tokens, raise rollout.max_model_len, or use run.overlong_prompts=truncate"
        )

    def _fit(self, batch: list[tuple[Task, int]]) -> list[tuple[Task, int]]:
        """Drop (and count) or keep prompts too long for the engine, as `overlong_prompts` says.
        One warning per batch at most, naming the first few tasks skipped, never one per task."""
        if self.prompt_limit is None or self.overlong_prompts == "truncate":
            return batch
        kept, skipped = [], []
        for task, samples in batch:
            length = len(self.render(task))
            if length > self.prompt_limit:
                skipped.append(f"{task.uid} ({length} tokens)")
                continue
            kept.append((task, samples))
        if skipped:
            reason = f"prompt longer than {self.prompt_limit} tokens"
            self.ledger.dropped[reason] = self.ledger.dropped.get(reason, 0) + len(skipped)
            self.ledger.submitted += len(skipped)  # counted as taken from the curriculum, so the ledger balances
            log.warning("%d of %d task(s) skipped, prompt longer than the %d tokens that fit the engine: %s",
                        len(skipped), len(batch), self.prompt_limit, a_few(skipped))
        return kept

    def _prompt(self, task: Task) -> tuple[int, ...]:
        return cut_to(self.render(task), self.prompt_limit)  # after `_fit`, only `truncate` leaves one too long

    def _submit_batch(self, index: int, batch: list[tuple[Task, int]]) -> None:
        tasks = [task for task, _ in batch]
        samples = [n for _, n in batch]
        prompts = [self._prompt(task) for task in tasks]
        log.info("Generating batch %d: %d prompts, %d samples, up to %d new tokens each",
                 index, len(prompts), sum(samples), self.sampling.max_tokens)
        with self.guard():
            pending = self.environment.submit(self.engine, tasks, prompts, samples, self._sampling_for(index))
        self._queue.append(_InFlight(index=index, tasks=tasks, samples=samples, prompts=prompts, pending=pending))
        self.ledger.repeated += self.groups.submitted(index, len(tasks))
        self.ledger.submitted += len(tasks)
        self.ledger.in_flight += len(tasks)

    def requeue_lost(self) -> int:
        """The engine died and took every batch in flight with it: submit them again, same tasks and
        seeds, in the same order. Returns how many batches were re-issued."""
        lost = list(self._queue)
        self._queue.clear()
        for entry in lost:
            self.ledger.submitted -= len(entry.tasks)
            self.ledger.in_flight -= len(entry.tasks)
            self._submit_batch(entry.index, list(zip(entry.tasks, entry.samples)))
        return len(lost)

    def snapshot(self) -> dict[str, Any]:
        """What a checkpoint needs: the batches in flight (by task uid) and the accounting so far."""
        return {
            "submitted_batches": self._submitted,
            "in_flight": [{"index": e.index, "tasks": [[t.uid, n] for t, n in zip(e.tasks, e.samples)]} for e in self._queue],
            "ledger": {"submitted": self.ledger.submitted, "trained": self.ledger.trained, "dropped": dict(self.ledger.dropped),
                       "repeated": self.ledger.repeated},
            "groups": self.groups.state_dict(),
        }

    def restore(self, snapshot: dict[str, Any], tasks_by_uid: dict[str, Task]) -> None:
        """Continue from a checkpoint. The batches that were in flight are kept (generated again with the same
        per-batch seeds, then trained) or dropped and counted, as `in_flight_on_resume` says."""
        if self._queue:
            raise RuntimeError("restore() on a scheduler that already has batches in flight")
        ledger = snapshot["ledger"]
        in_flight = [(b["index"], [(tasks_by_uid[uid], int(n)) for uid, n in b["tasks"]]) for b in snapshot["in_flight"]]
        waiting = sum(len(batch) for _, batch in in_flight)
        self.ledger = Ledger(submitted=int(ledger["submitted"]), trained=int(ledger["trained"]), dropped=dict(ledger["dropped"]),
                             in_flight=0,
                             repeated=int(ledger.get("repeated", 0)))
        self.groups.load_state_dict(snapshot.get("groups", {}))  # a checkpoint older than the record: counts only
        self._submitted = int(snapshot["submitted_batches"])
        if self.in_flight_on_resume == "drop":
            for index, batch in in_flight:
                self.ledger.repeated += self.groups.settled(index, [DROPPED] * len(batch))
            if waiting:
                self.ledger.dropped[DROPPED_AT_RESUME] = self.ledger.dropped.get(DROPPED_AT_RESUME, 0) + waiting
                log.warning("Resume: %d group(s) of %d batch(es) in flight at the checkpoint dropped and counted "
                            "(rollout_scheduler.in_flight_on_resume=drop): batches %s", waiting, len(in_flight),
                            a_few([str(index) for index, _ in in_flight]))
            return
        self.ledger.submitted -= waiting  # submitted again below, each counted once
        for index, batch in in_flight:
            self._submit_batch(index, batch)
        if waiting:
            log.info("Resume: %d group(s) of %d batch(es) in flight at the checkpoint generated again, to be trained "
                     "(rollout_scheduler.in_flight_on_resume=keep)", waiting, len(in_flight))

    def _sampling_for(self, index: int) -> SamplingSettings:
        # A seed per batch, derived from the run's seed and the batch's place in the run: a resumed run
        # samples exactly what the uninterrupted one would have, whatever the engine did before.
        if self.sampling.seed is None:
            return self.sampling
        return replace(self.sampling, seed=derive_seed(self.sampling.seed, index))

    def take(self, trainer_version: int) -> TakenBatch:
        """The oldest batch in flight (blocks until it is generated). Call `fill` first."""
        if self.interrupted is not None:
            raise GenerationInterrupted(self.interrupted)
        if not self._queue:
            raise RuntimeError("take() with nothing in flight: call fill() first")
        depth = len(self._queue)
        entry = self._queue[0]
        waited = time.perf_counter()
        with self.guard():
            generated = entry.pending.result()  # EngineLost and GenerationInterrupted leave it queued
        wait_s = time.perf_counter() - waited
        self._queue.popleft()
        self.generation_intervals.append((generated.started_s, generated.finished_s))
        gap = 0.0 if self._last_finished is None else max(generated.started_s - self._last_finished, 0.0)
        self._last_finished = generated.finished_s
        self.ledger.in_flight -= len(entry.tasks)
        groups, staleness, dropped, outcomes = [], [], [], []
        for task, prompt, completions in zip(entry.tasks, entry.prompts, generated.completions):
            lag = trainer_version - min(c.policy_version for c in completions)
            outcomes.append(DROPPED if lag > self.max_staleness else TRAINED)
            if lag > self.max_staleness:
                if self.stale_policy == "pace":  # the submit rule makes this impossible: a bug, not data
                    raise RuntimeError(f"staleness {lag} > rollout_scheduler.max_staleness={self.max_staleness} under pace")
                dropped.append((task.uid, lag))
                reason = f"staleness {lag} > max_staleness {self.max_staleness}"
                self.ledger.dropped[reason] = self.ledger.dropped.get(reason, 0) + 1
                continue
            groups.append(RolloutGroup(task, prompt, tuple(completions)))
            staleness.append(lag)
        self.ledger.trained += len(groups)
        self.ledger.repeated += self.groups.settled(entry.index, outcomes)
        return TakenBatch(groups=groups, staleness=staleness, dropped=dropped, generated=generated, wait_s=wait_s,
                          engine_gap_s=gap, queue_depth=depth)


def covered_seconds(spans: Sequence[tuple[float, float]]) -> float:
    """Length of the union of [start, end) spans."""
    total, current_end = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end <= current_end:
            continue
        total += end - max(start, current_end)
        current_end = end
    return total


def overlap_seconds(spans: Sequence[tuple[float, float]], others: Sequence[tuple[float, float]]) -> float:
    """Time covered by both the union of `spans` and the union of `others`."""
    both = [(max(a, c), min(b, d)) for a, b in spans for c, d in others if min(b, d) > max(a, c)]
    return covered_seconds(both)
