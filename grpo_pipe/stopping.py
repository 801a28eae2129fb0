"""Clean shutdown: SIGTERM or a first Ctrl-C asks the loop to stop after the step it is in (then a
checkpoint is written and the run is marked KILLED); a second Ctrl-C interrupts at once."""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType, TracebackType

log = logging.getLogger(__name__)


class StopRequest:
    """Context manager that turns stop signals into a flag the training loop checks between steps."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self._previous: dict[int, object] = {}

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

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.reason is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # asked twice: stop now
        self.reason = signal.Signals(signum).name
        log.warning("%s received: finishing this step, then writing a checkpoint (Ctrl-C again to stop at once)", self.reason)
