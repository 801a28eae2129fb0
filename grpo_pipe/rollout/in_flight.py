"""In-flight weight updates: new weights reach requests that are already running, and every token is
attributed to the weights that produced it.

A generation call steps vLLM's engine until its requests finish. Work queued on the `StepGate` (a weight
sync from another thread) runs between two steps; running requests keep their state and KV cache and
go on with the new weights. At that moment each running sample's output-token count is read, so its
tokens split exactly at the sync: `[0, k)` came from the old weights, `[k, end)` from the new ones (a
test checks the split against the same seeded run without the sync).

Two layouts, one contract:
- engine core in this process (CPU engines, engines inside Ray actors): between two steps nothing is
  computing; the scheduler's own per-request counts are read.
- engine core in its own process (vLLM's default, the GPU default): the core runs ahead of this process.
  The queued work runs inside vLLM's own `pause_scheduler(mode="keep")` / `resume_scheduler()`: the core
  stops scheduling, finishes the batch it is computing and flushes its outputs, which this process then
  takes in (they travel ahead of the pause's reply on the same socket); the counts are read from vLLM's
  per-request output state here, which now holds every token computed on the old weights.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from grpo_pipe.rollout.errors import GenerationAbandoned
from grpo_pipe.rollout.step_gate import StepGate


def engine_core_of(llm: Any) -> RunningCore | None:
    """How to reach the running requests of `llm`'s engine core, or None where neither layout applies."""
    client = getattr(llm.llm_engine, "engine_core", None)  # vLLM's client of its engine core
    core_here = getattr(client, "engine_core", None)  # the core itself, when it runs in this process
    requests = getattr(getattr(core_here, "scheduler", None), "requests", None)
    if isinstance(requests, Mapping):
        return CoreInThisProcess(requests)
    states = getattr(getattr(llm.llm_engine, "output_processor", None), "request_states", None)
    if hasattr(client, "call_utility") and hasattr(client, "outputs_queue") and isinstance(states, Mapping):
        return CoreInItsOwnProcess(client, states)
    return None


class RunningCore(Protocol):
    def token_counts(self) -> dict[tuple[str, int], int]:
        """(request id, sample index) -> output tokens computed so far, for every running sample."""
        ...

    def between_steps(self, step: Callable[[], list[Any]], work: Callable[[], None]) -> list[Any]:
        """Run `work` where no engine step is computing; returns the request outputs `step` is to return.

        Args:
            step: The engine core's own step.
            work: What must land between two steps (a weight update).
        """
        ...


class CoreInThisProcess:
    """An engine core running in this process: its scheduler's own per-request counts are read between two steps.

    Args:
        requests: The scheduler's live requests by engine request id.
    """

    def __init__(self, requests: Mapping[str, Any]) -> None:
        self.requests = requests

    def token_counts(self) -> dict[tuple[str, int], int]:
        return {sample_key(rid): tokens_scheduled(req) for rid, req in self.requests.items()}

    def between_steps(self, step: Callable[[], list[Any]], work: Callable[[], None]) -> list[Any]:
        work()  # this thread drives the core: no step runs until the next call
        return step()


class CoreInItsOwnProcess:
    """An engine core in a process of its own: work lands inside its pause, counts are read from the output state here.

    Args:
        client: vLLM's client of the engine-core process.
        states: vLLM's per-request output state in this process, by engine request id.
    """

    def __init__(self, client: Any, states: Mapping[str, Any]) -> None:
        self.client = client
        self.states = states

    def token_counts(self) -> dict[tuple[str, int], int]:
        return {sample_key(rid): int(state.detokenizer.num_output_tokens()) for rid, state in self.states.items()}

    def between_steps(self, step: Callable[[], list[Any]], work: Callable[[], None]) -> list[Any]:
        # Returns once the core computes nothing and every output it made was sent here (the reply travels
        # behind them); the prefix cache stays: running requests keep their KV, new ones get a new salt.
        self.client.call_utility("pause_scheduler", "keep", False)
        outputs: list[Any] = []
        try:
            while not self.client.outputs_queue.empty():  # no new outputs come while paused
                outputs.extend(step())
            work()
        finally:
            self.client.call_utility("resume_scheduler")
        return outputs  # the generation loop calls `step` again while requests remain


def sample_key(engine_request_id: str) -> tuple[str, int]:
    """("4", 1) for sample 1 of offline request "4": vLLM names a sample's child request `{index}_{parent}`
    (when n > 1) and may suffix internal ids (`4-8f3a...`)."""
    index, _, parent = engine_request_id.partition("_") if "_" in engine_request_id else ("0", "", engine_request_id)
    return parent.split("-", 1)[0], int(index)


def tokens_scheduled(request: Any) -> int:
    """Output tokens of a request that were computed, or are being computed, on the weights loaded so far.

    With async scheduling (vLLM's default on GPU) one batch may still be running when queued work runs:
    its forward pass was launched before the weight load, on the same stream, so its tokens come from
    the old weights, but they are still placeholders in the scheduler's counts.
    """
    return int(request.num_output_tokens) + int(getattr(request, "num_output_placeholders", 0) or 0)


@dataclass
class _Switch:
    tokens_done: dict[tuple[str, int], int]  # (request id, sample index) -> tokens generated before the switch
    version: int | None = None  # set when the engine's served version changes after the weights did


@dataclass
class InFlightLog:
    """The switches that happened during one generation call.

    Args:
        start_version: The policy version the engine served when the call started.
        switches: Each weight switch during the call, with every running sample's token count at that moment.
    """

    start_version: int
    switches: list[_Switch] = field(default_factory=list)

    def versions_of(self, request_id: str, sample: int, length: int) -> tuple[int, tuple[tuple[int, int], ...]]:
        """(version of the first token, ((token index, version), ...) for later switches) of one sample."""
        first, later = self.start_version, []
        for switch in self.switches:
            if switch.version is None:
                continue  # worker work that did not change the served version (e.g. a cache reset)
            done = switch.tokens_done.get((request_id, sample))
            if done is None:
                continue  # finished before the switch
            if done == 0 and not later:
                first = switch.version  # not started yet: all of it came from the newer weights
            elif done < length:
                later.append((done, switch.version))
        return first, tuple(later)


class InFlightUpdates:
    """The gate plus the bookkeeping that attributes tokens to versions.

    Args:
        enabled: Off: queued work waits for the end of the generation call.
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.gate = StepGate()
        self._log: InFlightLog | None = None
        self._core: RunningCore | None = None
        self.steps_taken = 0  # engine steps of the running generation call (0 between calls)
        self.abandoned = False  # set at shutdown: a running generation raises at its next step

    @contextmanager
    def generation(self, llm: Any, version: int) -> Iterator[InFlightLog]:
        """Wrap one generation call: queued work runs between its steps where tokens can be attributed."""
        log = InFlightLog(version)
        engine = llm.llm_engine
        core = engine_core_of(llm) if self.enabled else None
        with self.gate.generating():
            self._log, self._core = log, core
            step = engine.step

            def step_after_queued_work() -> Any:
                if self.abandoned:  # the engine is shutting down under a generation nobody waits for
                    raise GenerationAbandoned("the engine shut down during this generation")
                if core is None:
                    return step()
                self.steps_taken += 1
                if self.gate.has_pending():
                    return core.between_steps(step, self.gate.drain)
                return step()

            engine.step = step_after_queued_work  # an instance attribute: the class's method is untouched
            try:
                yield log
            finally:
                del engine.step
                self._log, self._core, self.steps_taken = None, None, 0

    def weights_changed(self) -> None:
        """Record where every running sample stands; called by the work that loaded new weights."""
        if self._log is None:
            return
        done = self._core.token_counts() if self._core is not None else {}
        self._log.switches.append(_Switch(done))

    def version_set(self, version: int) -> None:
        """The served version changed: it names the weights loaded at the latest unnamed switch."""
        if self._log is None:
            return
        unnamed = [s for s in self._log.switches if s.version is None]
        if not unnamed:
            self.weights_changed()
            unnamed = self._log.switches[-1:]
        unnamed[0].version = version
        for stale in unnamed[1:]:
            self._log.switches.remove(stale)  # later work of the same sync, not new weights
