"""Generation on a thread of the engine's own: the trainer trains while the engine generates the next batch."""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from dataclasses import dataclass
from typing import Any, TypeVar

from grpo_pipe.types import GeneratedBatch

log = logging.getLogger(__name__)

BACKGROUND_STOP_S = 60.0  # longest wait for the background generation to stop at shutdown (one engine step, normally)

Result = TypeVar("Result")


@dataclass(frozen=True)
class BackgroundRollout:
    """A generation running on the engine's own thread (`VllmEngine(background=True)`).

    Args:
        job: The generation's future on that thread.
    """

    job: Future[GeneratedBatch]

    def result(self) -> GeneratedBatch:
        return self.job.result()  # a stop signal in the waiting thread abandons the wait, not the engine


class BackgroundGenerator:
    """One thread, because vLLM's offline engine runs one generate call at a time: calls run in the order given."""

    def __init__(self) -> None:
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grpo-generate")
        self._last_job: Future[Any] | None = None

    def run(self, fn: Callable[..., Result], *args: Any) -> Future[Result]:
        job = self._thread.submit(fn, *args)
        self._last_job = job
        return job

    def stop(self) -> None:
        """Wait, bounded, for the last call (the caller has told the engine to end it at its next step), then
        drop the calls not yet started."""
        if self._last_job is not None and not wait_for([self._last_job], timeout=BACKGROUND_STOP_S).done:
            log.warning("the engine's generation thread did not stop within %.0f s; shutting the engine down under it",
                        BACKGROUND_STOP_S)
        self._thread.shutdown(wait=False, cancel_futures=True)
        self._last_job = None
