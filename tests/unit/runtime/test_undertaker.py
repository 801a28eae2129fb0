"""The undertaker with plain processes in Ray's place: a job starts a child that starts a grandchild and lives on (as
the raylet starts its agents, neither dying with the job); killed with SIGKILL, the job takes both with it. Dismissed,
or with its processes ended by the job itself, the undertaker goes and kills nothing."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import psutil

from grpo_pipe.runtime.undertaker import fate_shared

GONE_WITHIN_S = 30.0  # generous: the undertaker acts within a second, on a machine shared with other work

# A child that starts a grandchild, prints its pid, and lives on.
CHILD = "import subprocess, time; p = subprocess.Popen(['sleep', '300']); print(p.pid, flush=True); time.sleep(300)"
# A job that starts CHILD under an undertaker, prints the three pids, then (with "dismiss") dismisses it when a line
# comes in, and waits.
JOB = f"""
import subprocess, sys, time
from grpo_pipe.runtime.undertaker import fate_shared

def start():
    child = subprocess.Popen([sys.executable, "-c", {CHILD!r}], stdout=subprocess.PIPE)
    return child, int(child.stdout.readline())

(child, grandchild), undertaker = fate_shared(start)
print(child.pid, grandchild, undertaker.pid, flush=True)
if sys.argv[1:] == ["dismiss"]:
    sys.stdin.readline()
    undertaker.dismiss()
    print("dismissed", flush=True)
time.sleep(300)
"""


@contextmanager
def _job(*arguments: str) -> Iterator[tuple[subprocess.Popen[str], list[psutil.Process]]]:
    """The job, and its child, grandchild and undertaker (in that order); whatever is left is killed at the end."""
    job = subprocess.Popen([sys.executable, "-c", JOB, *arguments], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           text=True, start_new_session=True)
    processes: list[psutil.Process] = []
    try:
        assert job.stdout is not None
        processes = [psutil.Process(int(pid)) for pid in job.stdout.readline().split()]
        yield job, processes
    finally:
        job.kill()
        job.wait()
        for process in processes:
            if _running(process):
                process.kill()


def _running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _alive_after(processes: Sequence[psutil.Process], within_s: float) -> list[psutil.Process]:
    """Those of `processes` still running once `within_s` has passed or all are gone, whichever comes first."""
    deadline = time.monotonic() + within_s
    while any(map(_running, processes)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [p for p in processes if _running(p)]


def test_a_job_killed_outright_takes_what_it_started_and_its_descendants_with_it() -> None:
    with _job() as (job, processes):
        assert all(map(_running, processes))
        job.kill()  # SIGKILL: no handler, no atexit
        job.wait()
        assert _alive_after(processes, GONE_WITHIN_S) == []


def test_a_dismissed_undertaker_goes_and_kills_nothing() -> None:
    with _job("dismiss") as (job, (child, grandchild, undertaker)):
        assert job.stdin is not None and job.stdout is not None
        job.stdin.write("dismiss\n")
        job.stdin.flush()
        assert job.stdout.readline() == "dismissed\n"
        assert _alive_after([undertaker], GONE_WITHIN_S) == []
        assert _running(child) and _running(grandchild)


def test_the_undertaker_ends_by_itself_once_what_it_watches_has_ended() -> None:
    sleeper, undertaker = fate_shared(lambda: subprocess.Popen(["sleep", "300"]))
    try:
        sleeper.kill()
        sleeper.wait()
        assert psutil.Process(undertaker.pid).wait(timeout=GONE_WITHIN_S) == 0
    finally:
        undertaker.dismiss()
