"""A job of the command (`python -m grpo_pipe ...`) as the chaos and soak drivers see it: started as a process of its
own session, held at a named point (`runtime.halt`), its processes listed, and, once it is gone, any of them still
alive found: a process of a run that outlives it (an engine, a Ray worker, a sandbox) is a defect either driver reports.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

GONE_WITHIN_S = 60.0  # how long a process of a killed job may take to be reaped by the kernel before it counts as left


@dataclass
class Job:
    """One process of the command, its console in `log`.

    Args:
        proc: The job's main process.
        log: The file its console output goes to.
        marker: The file the job writes when it holds at its halt point; None: no halt point.
    """

    proc: subprocess.Popen[bytes]
    log: Path
    marker: Path | None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def held(self) -> bool:
        return self.marker is not None and self.marker.exists()

    def processes(self) -> list[psutil.Process]:
        """The job's process and every process below it, now."""
        try:
            root = psutil.Process(self.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def printed(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def start_job(arguments: Sequence[str], folder: Path, *, halt_at: str | None = None, cwd: Path | None = None) -> Job:
    """`python -m grpo_pipe <arguments>` in a session of its own, its output in `folder/job.log`; held at `halt_at`
    (`point@n`) when given."""
    folder.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "COLUMNS": "1000"}
    marker = None
    if halt_at is not None:
        marker = folder / "halted"
        env |= {"GRPO_PIPE_HALT_AT": halt_at, "GRPO_PIPE_HALT_MARKER": str(marker)}
    log = folder / "job.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "grpo_pipe", *arguments], cwd=cwd, stdout=out,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)
    return Job(proc, log, marker)


def wait_held_or_ended(job: Job, timeout_s: float) -> bool:
    """Wait until the job holds at its point (True) or ends (False); TimeoutError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if job.held():
            return True
        if job.proc.poll() is not None:
            return job.held()
        time.sleep(0.1)
    raise TimeoutError(f"job {job.pid} neither held nor ended within {timeout_s:.0f} s; its log: {job.log}")


def still_alive(processes: Sequence[psutil.Process], within_s: float = GONE_WITHIN_S) -> list[str]:
    """Of `processes` (listed while the job ran), those still running `within_s` after the job's end, each named by
    pid and command line (a zombie awaiting its parent counts as gone: it holds no memory and runs nothing)."""
    deadline = time.monotonic() + within_s
    while True:
        alive = [p for p in processes if _running(p)]
        if not alive or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    return [f"{p.pid} ({' '.join(_command_line(p))[:200]})" for p in alive]


def kill_left(processes: Sequence[psutil.Process]) -> None:
    """SIGKILL what a killed job left behind, so that a driver that found it leaves nothing either."""
    for process in processes:
        if _running(process):
            try:
                process.kill()
            except psutil.NoSuchProcess:
                continue


def _running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _command_line(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return ["?"]
