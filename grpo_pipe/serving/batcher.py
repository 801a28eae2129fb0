"""Requests that arrive one by one over HTTP, served by the engine in batches.

An environment process sends its requests one prompt at a time, many at once. Sending each to the engine on its own
would serve them one after another; instead one worker thread takes every request waiting when the engine is free,
groups the ones with the same sampling settings, and sends each group as one engine call (each prompt with its own
token budget). Requests that arrive while the engine is busy wait for the next round: the engine is never idle while
work waits, and calls still reach it in order, one at a time, as `RolloutEngine` requires. An environment's requests
of one moment arrive a few milliseconds apart: a round waits until `gather_s` (20 ms) after its oldest request arrived,
so that the first request of a burst does not take the engine alone and leave the rest for a second round (measured on
CPU with 16 requests sent at once: two or three engine calls per burst, 0.59 of the engine's own rate). Requests that
waited through an engine call are past that already and go at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any

from grpo_pipe.interfaces import RolloutEngine
from grpo_pipe.serving.served_log import ServedLog
from grpo_pipe.types import Completion, SamplingSettings

log = logging.getLogger(__name__)


class EndpointClosed(RuntimeError):
    """The endpoint is shutting down: the request was not, and will not be, served."""


@dataclass(frozen=True, kw_only=True)
class SamplingKey:
    """What requests must share to go to the engine in one call (everything but the token budget and the seed).

    Args:
        temperature: The sampling temperature.
        top_p: Nucleus sampling's probability mass.
        stop: Strings that end a sample.
        stop_token_ids: Token ids that end a sample.
    """

    temperature: float
    top_p: float
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()


@dataclass(kw_only=True)
class Request:
    """One prompt and how many samples of it; its future resolves to those samples.

    Args:
        prompt: The prompt's token ids.
        samples: How many completions of it to sample.
        max_tokens: The token budget of each completion.
        key: The sampling settings it shares with the requests it may be batched with.
        seed: The sampling seed; None: unseeded (a seeded request goes to the engine on its own).
        done: Resolves to the completions, or to the error that kept them from being served.
        arrived: When it was made (monotonic clock): a round gathers from the oldest one.
    """

    prompt: tuple[int, ...]
    samples: int
    max_tokens: int
    key: SamplingKey
    seed: int | None = None
    done: Future[list[Completion]] = field(default_factory=Future)
    arrived: float = field(default_factory=time.monotonic)


class RequestBatcher:
    """Feeds the engine from a queue of single requests, one batched call per round and sampling key.

    Args:
        engine: The engine the requests are served by.
        max_prompts_per_call: The most prompts one round takes from the queue.
        served: Where every completion served is recorded; None: not recorded.
        gather_s: How long a round waits for the rest of a burst before its engine call.
    """

    def __init__(self, *, engine: RolloutEngine, max_prompts_per_call: int = 1024, served: ServedLog | None = None,
                 gather_s: float = 0.02) -> None:
        self.engine = engine
        self.gather_s = gather_s
        self.served = served
        self.max_prompts_per_call = max_prompts_per_call
        self.engine_calls = 0  # rounds sent to the engine (each one `generate` call)
        self._queue: deque[Request] = deque()
        self._wake = threading.Condition()
        self._closed = False
        self._open = True  # False while paused: requests wait, the engine is the trainer's
        self._busy = False  # an engine call is in flight
        self._worker = threading.Thread(target=self._serve, name="grpo-endpoint-batcher", daemon=True)
        self._worker.start()

    @property
    def waiting(self) -> int:
        """Requests queued for the next round."""
        with self._wake:
            return len(self._queue)

    def submit(self, request: Request) -> Future[list[Completion]]:
        with self._wake:
            if self._closed:
                raise EndpointClosed("the endpoint is shutting down")
            self._queue.append(request)
            self._wake.notify_all()
        return request.done

    @property
    def paused(self) -> bool:
        with self._wake:
            return not self._open

    def pause(self) -> None:
        """Hold new rounds back and return once the round in flight is done: the engine is free for its owner
        (a weight sync, a held-out evaluation) until `resume`. Requests keep queueing meanwhile."""
        with self._wake:
            self._open = False
            while self._busy:
                self._wake.wait()

    def resume(self) -> None:
        with self._wake:
            self._open = True
            self._wake.notify_all()

    def close(self) -> None:
        """Stop taking requests; those still queued fail with a clear error, the round in flight finishes."""
        with self._wake:
            self._closed = True
            pending, self._queue = list(self._queue), deque()
            self._wake.notify_all()
        for request in pending:
            if request.done.set_running_or_notify_cancel():  # False: its client gave up already
                request.done.set_exception(EndpointClosed("the endpoint shut down before this request was served"))
        self._worker.join(timeout=5)

    def _serve(self) -> None:
        while True:
            with self._wake:
                while (not self._queue or not self._open) and not self._closed:
                    self._wake.wait()
                self._gather()
                if self._closed:
                    return
                if not self._open:  # paused while gathering: the engine is its owner's now
                    continue
                taken = [self._queue.popleft() for _ in range(min(len(self._queue), self.max_prompts_per_call))]
                self._busy = True
            try:
                # A request whose client gave up (timed out) is cancelled and not sent; the others can no longer be.
                batch = [r for r in taken if r.done.set_running_or_notify_cancel()]
                for key, requests in _by_key(batch).items():
                    self._run(key, requests)
            finally:
                with self._wake:
                    self._busy = False
                    self._wake.notify_all()

    def _gather(self) -> None:
        """With the lock held: let the rest of a burst arrive (each arrival wakes the wait), until `gather_s` after the
        oldest waiting request arrived."""
        deadline = self._queue[0].arrived + self.gather_s if self._queue else time.monotonic()
        while len(self._queue) < self.max_prompts_per_call and not self._closed:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._wake.wait(left)

    def _run(self, key: SamplingKey, requests: Sequence[Request]) -> None:
        # A seeded request is sampled alone, so its samples depend on its seed and not on what else was waiting.
        unseeded = [r for r in requests if r.seed is None]
        groups = ([unseeded] if unseeded else []) + [[r] for r in requests if r.seed is not None]
        for group in groups:
            sampling = _sampling(key, group)
            try:
                self.engine_calls += 1
                outputs = self.engine.generate([r.prompt for r in group], [r.samples for r in group], sampling)
            except Exception as err:  # the engine's failure is every waiting request's answer, not the server's end
                log.warning("endpoint: an engine call of %d requests failed: %s: %s", len(group), type(err).__name__, err)
                for request in group:
                    request.done.set_exception(err)
                continue
            for request, output in zip(group, outputs):
                if self.served is not None:
                    for completion in output:
                        self.served.record(request.prompt, completion, key.temperature)
                request.done.set_result(list(output))


def _by_key(requests: Sequence[Request]) -> dict[SamplingKey, list[Request]]:
    groups: dict[SamplingKey, list[Request]] = {}
    for request in requests:
        groups.setdefault(request.key, []).append(request)
    return groups


def _sampling(key: SamplingKey, requests: Sequence[Request]) -> SamplingSettings:
    extra: dict[str, Any] = {}
    if key.stop:
        extra["stop"] = list(key.stop)
    if key.stop_token_ids:
        extra["stop_token_ids"] = list(key.stop_token_ids)
    budgets = tuple(r.max_tokens for r in requests)
    base = SamplingSettings(temperature=key.temperature, top_p=key.top_p, max_tokens=max(budgets),
                            seed=requests[0].seed, extra=extra)
    return replace(base, max_tokens_each=budgets)
