"""The `python` tool (`environment.tools=[python]`): a Python interpreter for a model, which runs a snippet in a
separate, limited process and returns what it printed.

Layers, outermost first (each one still holds where an inner one is bypassed):
- a child `python -I` in a fresh temporary directory (deleted afterwards), minimal environment, own session;
  the parent enforces the wall clock (SIGKILL to the whole process group) and reads at most `output_bytes` + 1 bytes;
- where the kernel allows it, new user, network and pid namespaces: no network at all, and no signal reaches a
  process outside (`pidfd_send_signal` has no audit event); when the snippet's process ends, the kernel ends
  every process it started;
- rlimits set in the child: CPU seconds, address space, file size, no core files;
- an audit hook (`sys.addaudithook`) installed last: no sockets, processes, ctypes, tracing or sub-interpreters;
  writes only inside the directory, reads only there and in the Python installation (stdlib and site-packages).

An audit hook is not a security boundary on its own: C extensions do unaudited I/O, `os.mkfifo` has no event, and
bytecode built with `marshal` (which imports need) can corrupt memory. Within that, the hook binds everything it
uses as default arguments and reads no global or builtin name, so a snippet that rebinds `os`, `builtins` or a
module attribute cannot change what it checks.
"""

from __future__ import annotations

import json
import logging
import math
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from grpo_pipe.config.errors import failed
from grpo_pipe.environments.tools.errors import ToolError

logger = logging.getLogger(__name__)

MAX_CODE_CHARS = 20_000
FILE_BYTES = 8 * 1024 * 1024  # RLIMIT_FSIZE: the largest file a snippet may write
_READ_CHUNK = 64 * 1024
_SNIPPET_FILE = "snippet.py"  # read and deleted by the bootstrap before the snippet runs
_KILLED_BY_CPU_LIMIT = (-signal.SIGXCPU, -signal.SIGKILL)  # soft == hard limit: the kernel sends SIGKILL

# Runs in the child as `python -I -c _BOOTSTRAP CONFIG_JSON`. Order matters: namespaces (needs ctypes), then
# rlimits, then the audit hook, then the snippet.
_BOOTSTRAP = (Path(__file__).parent / "_sandbox_child.py").read_text(encoding="utf-8")


@dataclass(frozen=True, kw_only=True)
class _Finished:
    """What came back from one run of the child."""

    output: bytes  # at most output_bytes + 1 bytes
    returncode: int
    timed_out: bool
    isolated: bool  # the child entered its own user, network and pid namespaces


@dataclass(kw_only=True, eq=False)
class PythonSandbox:
    """Runs model-written Python in a limited child process; the snippet's failures come back as text.

    Args:
        cpu_s: CPU seconds the snippet may use (rounded up to whole seconds: RLIMIT_CPU counts seconds).
        wall_s: wall-clock seconds before the parent kills it, start-up included.
        memory_mb: address space of the child (RLIMIT_AS); an allocation past it raises MemoryError.
        output_bytes: the most bytes of stdout + stderr returned; the rest is read and dropped.
        max_processes: how many processes the snippet may fork (os.fork; the forks keep every restriction).
            New programs (exec, system, subprocess) are always refused: they would run without the audit hook.
    """

    cpu_s: float = 5.0
    wall_s: float = 10.0
    memory_mb: int = 512
    output_bytes: int = 4096
    max_processes: int = 0
    _warned: bool = field(default=False, init=False, repr=False)  # said once that the kernel gave no namespaces

    def config_problems(self) -> list[str]:
        """The limits' own rules, each named by its setting (the toolbox puts them under `tool_options.python`)."""
        return failed(
            (self.cpu_s >= 1e-3, f"cpu_s={self.cpu_s!r}: must be >= 0.001 (CPU seconds a snippet may use)"),
            (self.wall_s >= 1e-3, f"wall_s={self.wall_s!r}: must be >= 0.001 (seconds before the snippet is killed)"),
            (self.memory_mb >= 64, f"memory_mb={self.memory_mb!r}: must be >= 64 (the interpreter itself needs that)"),
            (self.output_bytes >= 1, f"output_bytes={self.output_bytes!r}: must be >= 1"),
            (self.max_processes >= 0, f"max_processes={self.max_processes!r}: must be >= 0"),
        )

    def __call__(self, code: str) -> str:
        """Run a Python snippet and return what it prints.

        Args:
            code: Python source to run; print the values you want to see.
        """
        if not isinstance(code, str):
            raise ToolError(f"code must be a string, got {type(code).__name__}")
        if len(code) > MAX_CODE_CHARS:
            raise ToolError(f"the code is {len(code)} characters long; the limit is {MAX_CODE_CHARS}")
        with tempfile.TemporaryDirectory(prefix="grpo-sandbox-", ignore_cleanup_errors=True) as workdir:
            (Path(workdir) / _SNIPPET_FILE).write_text(code, encoding="utf-8")
            finished = self._run(workdir)
        if not finished.isolated and not self._warned:
            self._warned = True
            logger.warning("python sandbox: no user/network/pid namespaces on this machine; the audit hook and rlimits remain")
        return self._describe(finished)

    def _run(self, workdir: str) -> _Finished:
        """Start the child, collect its output within the wall clock, and leave no process of its group behind."""
        deadline = time.monotonic() + self.wall_s
        status_read, status_write = os.pipe()  # the child writes b"1" here once inside its namespaces
        try:
            proc = self._start(workdir, status_write)
        except BaseException:
            os.close(status_read)
            raise
        finally:
            os.close(status_write)
        try:
            assert proc.stdout is not None  # stdout=PIPE
            output, timed_out = self._read(proc.stdout.fileno(), deadline)
            returncode = _wait(proc, deadline)
        finally:
            _kill_group(proc)
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
            # Every writer is gone now, so this read cannot block.
            isolated = os.read(status_read, 1) == b"1"
            os.close(status_read)
        return _Finished(output=output, returncode=returncode or 0, timed_out=timed_out or returncode is None, isolated=isolated)

    def _start(self, workdir: str, status_fd: int) -> subprocess.Popen[bytes]:
        """The child: the bootstrap with its settings, in a new session so that one killpg ends all of it."""
        config = {
            "workdir": workdir,
            "snippet": str(Path(workdir) / _SNIPPET_FILE),
            "status_fd": status_fd,
            "cpu_s": math.ceil(self.cpu_s),
            "alarm_s": math.ceil(self.wall_s) + 2,
            "memory_bytes": self.memory_mb * 1024 * 1024,
            "file_bytes": FILE_BYTES,
            "max_processes": self.max_processes,
            "parent_pid": os.getpid(),  # the child exits at once if this process is gone before it can follow it
        }
        return subprocess.Popen(
            [sys.executable, "-I", "-B", "-u", "-X", "utf8", "-c", _BOOTSTRAP, json.dumps(config)],
            cwd=workdir,
            env=_child_env(workdir),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            pass_fds=(status_fd,),
            start_new_session=True,
        )

    def _read(self, fd: int, deadline: float) -> tuple[bytes, bool]:
        """Up to output_bytes + 1 bytes of the child's output, and whether the wall clock ran out first.

        Reading goes on (dropping the bytes) until the pipe closes, so a chatty snippet finishes instead of
        blocking on a full pipe; memory stays bounded by the cap.
        """
        kept = bytearray()
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while (left := deadline - time.monotonic()) > 0:
                if not selector.select(left):
                    continue
                chunk = os.read(fd, _READ_CHUNK)
                if not chunk:
                    return bytes(kept), False
                kept += chunk[: self.output_bytes + 1 - len(kept)]
        return bytes(kept), True

    def _describe(self, finished: _Finished) -> str:
        """The observation: the output (capped), then what ended the run if it did not end by itself."""
        text = finished.output[: self.output_bytes].decode("utf-8", "replace").rstrip("\n")
        notes = []
        if len(finished.output) > self.output_bytes:
            notes.append(f"...[output truncated at {self.output_bytes} bytes]")
        if finished.timed_out:
            notes.append(f"error: timed out after {self.wall_s:g} s (wall clock)")
        elif finished.returncode in _KILLED_BY_CPU_LIMIT:
            notes.append(f"error: CPU time limit ({math.ceil(self.cpu_s)} s) exceeded")
        elif finished.returncode < 0:
            notes.append(f"error: the snippet was killed by {_signal_name(-finished.returncode)}")
        if not text and not notes:
            return "(no output: print the values you want to see)"
        return "\n".join([text, *notes] if text else notes)


TOOL = PythonSandbox  # the tool this module ships, under the module's name


def _child_env(workdir: str) -> dict[str, str]:
    """PATH and nothing of the user's; temporary files and ~ point into the working directory."""
    return {"PATH": os.defpath, "PYTHONDONTWRITEBYTECODE": "1", "HOME": workdir, "TMPDIR": workdir}


def _signal_name(number: int) -> str:
    """SIGSEGV for 11; real-time signals (signal.raise_signal(40)) have no name of their own."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _wait(proc: subprocess.Popen[bytes], deadline: float) -> int | None:
    """The child's return code, or None when the wall clock runs out first."""
    try:
        return proc.wait(timeout=max(deadline - time.monotonic(), 0.0))
    except subprocess.TimeoutExpired:
        return None


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL every process of the child's session: a timed-out snippet or what it forked."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is gone already
