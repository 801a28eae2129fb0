"""An undertaker: a small watcher process that SIGKILLs what a library started for this job (a local Ray node: its GCS,
raylet, and the agents and workers the raylet starts) once the job's process is gone, however it went.

Why it exists: Ray ties its GCS and raylet to the driver with Linux's parent-death signal, but the raylet's agents
(`ray::DashboardAgent`, `ray::RuntimeEnvAgent`) only see their raylet die by watching it, and then report the death to
the GCS, which died too, with a fixed 60 s timeout (Ray 2.60, `ray/_private/process_watcher.py`). A driver killed with
SIGKILL so leaves them running for a minute, and no Ray option stops the raylet from starting them. A run's processes
must not outlive it.

How: `fate_shared(start)` calls `start` (e.g. `ray.init`), takes the child processes it started as roots, and starts
the watcher beside them. The watcher notes every descendant of the roots each second (the agents are orphaned when the
raylet dies, so they must be known before) and looks at its own parent pid five times a second: when that changes, the
job's process is dead (the kernel hands its orphans to init or a subreaper), and the watcher kills everything it noted
and exits. It watches the parent pid rather than ask for `PR_SET_PDEATHSIG`, which fires when the *thread* that started
the child ends, not the process. It also exits, killing nothing, when its roots are gone (the job stopped them itself)
or when dismissed (`Undertaker.dismiss`).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from typing import TypeVar

import psutil

log = logging.getLogger(__name__)

WATCH_EVERY_S = 0.2  # how often the watcher looks at its parent: a dead job's processes go within a fraction of a second
NOTE_EVERY_S = 1.0  # how often it notes the roots' descendants (Ray's workers come and go; a scan reads all of /proc)
READY = b"ready\n"  # the watcher's one line on its stdout: its first note is taken, the roots are covered from now on

T = TypeVar("T")


class Undertaker:
    """The running watcher of one set of roots; `fate_shared` starts it.

    Args:
        proc: The watcher's own process.
    """

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self._proc = proc

    @property
    def pid(self) -> int:
        return self._proc.pid

    def dismiss(self) -> None:
        """The job stopped what it started: the watcher goes, killing nothing. (It ignores SIGTERM, see `_main`.)"""
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()


def fate_shared(start: Callable[[], T]) -> tuple[T, Undertaker]:
    """`start()`, and an undertaker for every child process it started (and their descendants, now and later).

    Children that another thread of this process starts while `start` runs are counted in too."""
    before = set(_children())
    result = start()
    return result, watch([p for p in _children() if p not in before])


def watch(roots: Iterable[psutil.Process]) -> Undertaker:
    """Start the watcher of `roots` (processes of this machine) as a child of this process; returns once it is armed."""
    named = [f"{p.pid}@{p.create_time()!r}" for p in roots]  # the start time tells a reused pid from the root
    proc = subprocess.Popen([sys.executable, "-m", __name__, str(os.getpid()), *named], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE)
    assert proc.stdout is not None
    with proc.stdout:
        ready = proc.stdout.readline()
    if ready != READY:
        proc.kill()
        raise RuntimeError(f"the undertaker (pid {proc.pid}) did not start (exit code {proc.wait()}); see its output above")
    return Undertaker(proc)


def _children() -> list[psutil.Process]:
    return psutil.Process().children()


def _noted(known: Iterable[psutil.Process]) -> set[psutil.Process]:
    """Those of `known` still running, and all their descendants now."""
    by_parent: dict[int, list[psutil.Process]] = {}
    for process in psutil.process_iter(["ppid"]):
        by_parent.setdefault(process.info["ppid"], []).append(process)
    found: set[psutil.Process] = set()
    stack = [p for p in known if _running(p)]
    while stack:
        process = stack.pop()
        if process not in found:
            found.add(process)
            stack += by_parent.get(process.pid, [])
    return found


def _running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _bury(noted: set[psutil.Process], parent: int) -> None:
    alive = _noted(noted)
    if alive:
        log.warning("process %d is gone; killing the %d processes it left: %s", parent, len(alive),
                    ", ".join(f"{p.pid} ({_name(p)})" for p in alive))
    for process in alive:
        try:
            process.kill()  # psutil checks the start time first: a pid reused since is left alone
        except psutil.Error:
            continue


def _name(process: psutil.Process) -> str:
    try:
        return process.name()
    except psutil.Error:
        return "?"


def _root(named: str) -> psutil.Process | None:
    """`pid@start_time` -> that process, None if it is gone (or its pid now names another process)."""
    pid, _, started = named.partition("@")
    try:
        process = psutil.Process(int(pid))
        return process if abs(process.create_time() - float(started)) < 1e-3 else None
    except psutil.Error:
        return None


def _main(parent: int, named: list[str]) -> None:
    # Ctrl-C or a SIGTERM to the job's whole group is for the job, which then stops what it started; the watcher stays
    # until the job is gone, in case it never gets that far.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    noted = _noted(r for r in map(_root, named) if r is not None)
    os.write(1, READY)
    quiet = os.open(os.devnull, os.O_WRONLY)
    os.dup2(quiet, 1)  # lets go of the pipe, so the job's read of it ends
    os.close(quiet)
    next_note = time.monotonic() + NOTE_EVERY_S
    while os.getppid() == parent:
        time.sleep(WATCH_EVERY_S)
        if time.monotonic() >= next_note:
            noted = _noted(noted)
            next_note = time.monotonic() + NOTE_EVERY_S
            if not noted:
                return  # the job stopped its processes itself: nothing is left to bury
    _bury(noted, parent)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s undertaker: %(message)s")
    _main(int(sys.argv[1]), sys.argv[2:])
