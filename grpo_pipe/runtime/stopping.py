"""Clean shutdown within a bounded time.

SIGTERM or a first Ctrl-C asks the run to stop: a generation in progress (which may run for minutes
with a large budget) is abandoned at once, the checkpoint of the last finished step is written and
the run is marked KILLED. A stop that takes longer than `grace_s` (a hung engine, a slow disk) ends
the process anyway, and a second signal ends it at once; both exit with 128 + the signal's number.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType, TracebackType

log = logging.getLogger(__name__)


class GenerationInterrupted(BaseException):
    """A stop signal arrived during a generation, which was abandoned.

    A BaseException (like KeyboardInterrupt), so that no `except Exception` inside the engine can
    swallow it and go on generating."""


class StopRequest:
    """Context manager that turns stop signals into a flag the training loop checks between steps,
    and into `GenerationInterrupted` inside an `interruptible()` block.

    Args:
        grace_s: Seconds a stop may take before the process is ended; None: no deadline.
    """

    def __init__(self, grace_s: float | None = None) -> None:
        self.reason: str | None = None
        self.grace_s = grace_s
        self._previous: dict[int, object] = {}
        self._interruptible = 0
        self._deadline: threading.Timer | None = None
        self._ends_at: float | None = None  # monotonic time at which the grace deadline ends the process

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():  # signals can only be caught there
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]
        self._previous = {}
        # The deadline stays armed after a signal: closing the engine and the tracker is part of the stop.

    def remaining_s(self) -> float | None:
        """Seconds left before the grace deadline ends the process; None while no stop with a deadline is under way."""
        if self._ends_at is None:
            return None
        return max(self._ends_at - time.monotonic(), 0.0)

    @contextmanager
    def interruptible(self) -> Iterator[None]:
        """A block (a generation) that a stop signal may abandon by raising `GenerationInterrupted`."""
        if self.reason is not None:
            raise GenerationInterrupted(self.reason)  # asked already: do not start another one
        self._interruptible += 1
        try:
            yield
        finally:
            self._interruptible -= 1

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.reason is not None:  # asked twice: stop now
            log.error("%s received again: exiting now", name)
            logging.shutdown()
            os._exit(128 + signum)
        self.reason = name
        if self.grace_s is not None:
            self._ends_at = time.monotonic() + self.grace_s
            self._deadline = threading.Timer(self.grace_s, self._exit_late, args=(signum,))
            self._deadline.daemon = True
            self._deadline.start()
        if self._interruptible:
            log.warning("%s received: abandoning the generation in progress, writing the last finished step's "
                        "checkpoint (signal again to exit at once)", name)
            raise GenerationInterrupted(name)
        log.warning("%s received: finishing this step, then writing a checkpoint (signal again to exit at once)", name)

    def _exit_late(self, signum: int) -> None:
        # Written straight to stderr: the logging lock may be held by the thread this deadline overrides.
        os.write(2, f"Stop took longer than run.shutdown_grace_s={self.grace_s} s: exiting without finishing it\n".encode())
        os._exit(128 + signum)
