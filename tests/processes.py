"""What the tests of stops and failures do to a running job: stop its process the way a user or a scheduler does
(SIGTERM; the process always ends with the test, whatever the test found), or break something once the run is mid-way
(a crash, a lost machine), shared by the tests that check what the job makes of it."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def reaped(proc: subprocess.Popen[str]) -> Iterator[subprocess.Popen[str]]:
    """`proc` while the block runs; killed and waited for after it, if it still runs (a failed wait, a stop that hung)."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def stop_with_sigterm(proc: subprocess.Popen[str], grace_s: float) -> tuple[str, float]:
    """SIGTERM, then wait for the process to end (its grace and a minute more at most): what it printed (stdout with
    stderr merged) and the seconds from the signal to its end."""
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=grace_s + 60)
    return out, time.monotonic() - sent


@contextmanager
def once_it_exists(path: Path, action: Callable[[], None]) -> Iterator[None]:
    """While the block runs (a job), `action()` on a thread of its own as soon as `path` exists (a checkpoint: the run
    is mid-way); the block's end stops a wait that is still on and joins the thread."""
    done = threading.Event()

    def wait_then_act() -> None:
        while not path.exists():
            if done.wait(0.05):
                return
        action()

    thread = threading.Thread(target=wait_then_act, name="test-mid-run")
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
