"""Work on an engine between two of its steps while a generation call is running.

vLLM's offline engine runs one `generate` call at a time, stepping its scheduler until every request
is done. A weight update that arrives from another thread during that call is queued here and run by
the generating thread between two steps: running requests keep their state and KV cache and continue
on the new weights (what vLLM's async engine calls `pause_generation(mode="keep")`). When no
generation runs, the work runs at once. Either way it never overlaps an engine step.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any


class StepGate:
    def __init__(self) -> None:
        # Re-entrant, and the generating thread runs work at once: work may itself go through the gate (a bridge's
        # sync calls an engine method that does), and must not wait for the thread that is running it.
        self._lock = threading.RLock()
        self._pending: deque[tuple[Callable[[], Any], Future[Any]]] = deque()
        self._generating = False
        self._generator: int | None = None  # the generating thread's id: between two of its steps when it asks

    def __getstate__(self) -> dict[str, Any]:
        return {}  # an engine spec sent to another process gets a fresh, idle gate

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]

    def run(self, work: Callable[[], Any]) -> Any:
        """Run `work` between two engine steps (or now, if the engine is idle); return its result."""
        if self._generator == threading.get_ident():
            return work()  # the generating thread itself, between steps (or draining): no step is running
        with self._lock:
            if not self._generating:
                return work()  # under the lock: a generation cannot start meanwhile
            done: Future[Any] = Future()
            self._pending.append((work, done))
        return done.result()

    @property
    def in_generation(self) -> bool:
        """Whether a generation call holds the gate: work given now waits for the next step boundary."""
        return self._generating

    def has_pending(self) -> bool:
        return bool(self._pending)

    def drain(self) -> None:
        """Run the queued work; called by the generating thread between steps."""
        with self._lock:
            batch = list(self._pending)
            self._pending.clear()
        for work, done in batch:
            try:
                done.set_result(work())
            except BaseException as err:  # handed to the thread that asked for the work
                done.set_exception(err)

    @contextmanager
    def generating(self) -> Iterator[None]:
        with self._lock:
            self._generating, self._generator = True, threading.get_ident()
        try:
            yield
        finally:
            while True:  # work that arrived after the last step runs here, before the gate opens
                with self._lock:
                    if not self._pending:
                        self._generating, self._generator = False, None
                        break
                self.drain()
