"""In-flight weight updates: new weights reach requests that are already running, and every token is
attributed to the weights that produced it.

A generation call steps vLLM's scheduler until its requests finish. Work queued on the `StepGate`
(a weight sync from another thread) runs between two steps; running requests keep their state and KV
cache and go on with the new weights, as with vLLM's `pause_generation(mode="keep")`. At that moment
the scheduler's per-request output-token counts are read, so each sample's tokens split exactly at
the sync: `[0, k)` came from the old weights, `[k, end)` from the new ones (a test checks the split
against the same seeded run without the sync).

Reading those counts needs the engine core in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`: CPU
engines and engines inside Ray actors). Where they cannot be read (an engine core in its own process,
the colocated GPU default), no step hook is installed: queued work then waits for the end of the
generation call, and no completion mixes versions. vLLM's own `pause_scheduler(mode="keep")` would pause
such an engine, but it reports no per-request token counts to split the versions at.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from grpo_pipe.rollout.step_gate import StepGate


def scheduler_requests(llm: Any) -> Mapping[str, Any] | None:
    """The in-process scheduler's live requests by engine request id, or None where not reachable."""
    core = getattr(getattr(llm.llm_engine, "engine_core", None), "engine_core", None)
    requests = getattr(getattr(core, "scheduler", None), "requests", None)
    return requests if isinstance(requests, Mapping) else None


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
    """The switches that happened during one generation call."""

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
    """The gate plus the bookkeeping that attributes tokens to versions."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled  # off: queued work waits for the end of the generation call
        self.gate = StepGate()
        self._log: InFlightLog | None = None
        self._llm: Any = None
        self.steps_taken = 0  # engine steps of the running generation call (0 between calls)

    @contextmanager
    def generation(self, llm: Any, version: int) -> Iterator[InFlightLog]:
        """Wrap one generation call: queued work runs between its steps where tokens can be attributed."""
        log = InFlightLog(version)
        engine = llm.llm_engine
        hook = self.enabled and scheduler_requests(llm) is not None
        with self.gate.generating():
            self._log, self._llm = log, llm
            if hook:
                step = engine.step

                def step_after_queued_work() -> Any:
                    if self.gate.has_pending():
                        self.gate.drain()
                    self.steps_taken += 1
                    return step()

                engine.step = step_after_queued_work  # an instance attribute: the class's method is untouched
            try:
                yield log
            finally:
                if hook:
                    del engine.step
                self._log, self._llm, self.steps_taken = None, None, 0

    def weights_changed(self) -> None:
        """Record where every running sample stands; called by the work that loaded new weights."""
        if self._log is None:
            return
        requests = scheduler_requests(self._llm) or {}
        done = {sample_key(rid): tokens_scheduled(req) for rid, req in requests.items()}
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
