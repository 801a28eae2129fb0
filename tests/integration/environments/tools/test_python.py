"""The Python sandbox against real processes, files and sockets: what a snippet may do, what it may not, and
that every limit ends the run with a message the model can read (the tool itself raises only for bad arguments)."""

import dis
import select
import socket
import textwrap
import time
from pathlib import Path

import pytest

from grpo_pipe.environments.tools.errors import ToolError
from grpo_pipe.environments.tools.python import _BOOTSTRAP, MAX_CODE_CHARS, PythonSandbox

# Generous: the suite runs beside other work on two cores; these bound a hang, they do not measure speed.
PROMPT_S = 30.0
READ_REFUSED = "PermissionError: sandbox: reading '/etc/passwd' is not allowed: only the working directory and Python's files"


def run(code: str, **limits: float) -> str:
    return PythonSandbox(**limits)(textwrap.dedent(code))  # type: ignore[arg-type]


def test_returns_what_the_snippet_prints() -> None:
    assert run("print(sum(range(10)))") == "45"


def test_an_exception_is_its_traceback_not_a_crash() -> None:
    result = run(
        """
        def ratio(a, b):
            return a / b
        print("before")
        ratio(1, 0)
        """
    )
    assert result.startswith("before\nTraceback (most recent call last):")
    assert 'File "<snippet>", line 3, in ratio' in result
    assert result.endswith("ZeroDivisionError: division by zero")
    assert "<string>" not in result  # the bootstrap's own frames are not shown


def test_a_syntax_error_is_reported() -> None:
    assert run("x = (1,").endswith("SyntaxError: '(' was never closed")


def test_reading_outside_is_refused() -> None:
    result = run("print(open('/etc/passwd').read())")
    assert result.endswith(READ_REFUSED)
    assert "root:" not in result


def test_writing_outside_is_refused_and_leaves_no_file(tmp_path: Path) -> None:
    target = tmp_path / "x"
    result = run(f"open({str(target)!r}, 'w').write('escaped')")
    assert result.endswith(f"PermissionError: sandbox: writing {str(target)!r} is not allowed: only inside the working directory")
    assert not target.exists()


def test_writing_inside_works_and_the_directory_is_removed_after() -> None:
    result = run(
        """
        import os
        with open("notes.txt", "w") as f:
            f.write("kept")
        os.mkdir("sub")
        print(open("notes.txt").read(), sorted(os.listdir(".")), os.getcwd())
        """
    )
    text, names, workdir = result.split(" ", 2)
    assert text == "kept" and names == "['notes.txt',"
    assert Path(workdir).name.startswith("grpo-sandbox-")
    assert not Path(workdir).exists()


def test_a_connection_to_a_real_listener_is_refused() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        result = run(f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)")
        assert "PermissionError: sandbox: network access (socket." in result
        ready, _, _ = select.select([listener], [], [], 0.5)
        assert ready == []  # nothing ever knocked


def test_fork_is_refused() -> None:
    assert run("import os; os.fork()").endswith("PermissionError: sandbox: starting processes (os.fork) is not allowed")


def test_subprocess_is_refused() -> None:
    result = run("import subprocess; subprocess.run(['ls'])")
    assert result.endswith("PermissionError: sandbox: starting processes (subprocess.Popen) is not allowed")


def test_a_fork_bomb_ends_promptly_with_an_error() -> None:
    started = time.monotonic()
    result = run(
        """
        import os
        while True:
            os.fork()
        """
    )
    assert result.endswith("PermissionError: sandbox: starting processes (os.fork) is not allowed")
    assert time.monotonic() - started < PROMPT_S


def test_allocating_past_the_memory_limit_is_a_memory_error() -> None:
    assert run("data = bytearray(4 * 1024**3)").endswith("MemoryError")


def test_a_busy_loop_ends_at_the_cpu_limit() -> None:
    started = time.monotonic()
    result = run(
        """
        print("spinning")
        while True:
            pass
        """,
        cpu_s=1,
        wall_s=PROMPT_S,
    )
    assert result == "spinning\nerror: CPU time limit (1 s) exceeded"
    assert time.monotonic() - started < PROMPT_S


def test_a_sleep_ends_at_the_wall_clock_limit() -> None:
    started = time.monotonic()
    result = run(
        """
        import time
        print("sleeping")
        time.sleep(100)
        """,
        wall_s=1,
    )
    # On a loaded machine the interpreter may not even reach the print within 1 s: only the ending is certain.
    assert result.endswith("error: timed out after 1 s (wall clock)")
    assert time.monotonic() - started < PROMPT_S


def test_output_is_capped_with_a_note() -> None:
    result = run("print('x' * 10_000_000)", output_bytes=4096)
    note = "\n...[output truncated at 4096 bytes]"
    assert result == "x" * 4096 + note


def test_the_standard_library_imports() -> None:
    code = """
        import json, math, fractions, itertools
        half = fractions.Fraction(1, 3) + fractions.Fraction(1, 6)
        print(json.dumps([math.comb(5, 2), str(half), len(list(itertools.permutations(range(4))))]))
    """
    assert run(code) == '[10, "1/2", 24]'


def test_nothing_printed_says_so() -> None:
    assert run("x = 1") == "(no output: print the values you want to see)"


def test_the_sandbox_cannot_change_its_own_checks() -> None:
    # Rebinding what the hook might use (a builtin, os.path, posix) changes nothing: it bound its own copies. Its
    # helpers are reachable from a traceback's frame, and rebinding their defaults is refused.
    result = run(
        """
        import builtins, os, posix, posixpath
        builtins.PermissionError = KeyError
        posixpath.realpath = os.path.realpath = lambda path, **_: os.getcwd() + "/ok"
        posix.lstat = posix.stat = lambda *_: os.stat(".")
        try:
            open("/etc/passwd")
        except OSError as error:
            tb = error.__traceback__
            while tb.tb_next:
                tb = tb.tb_next
            try:
                tb.tb_frame.f_locals["_resolve"].__defaults__ = None
            except OSError as refused:
                print(refused)
        open("/etc/passwd")
        """
    )
    assert result.startswith("sandbox: changing the sandbox's own functions is not allowed\nTraceback")
    assert result.endswith(READ_REFUSED)


def test_the_hook_reads_no_global_or_builtin_name() -> None:
    # A snippet can rebind any module global or builtin; the hook and its helpers only read their own defaults.
    definitions: dict[str, object] = {"__name__": "not_main"}
    exec(compile(_BOOTSTRAP, "<string>", "exec"), definitions)
    hook = definitions["make_hook"]("/tmp/work", ("/usr/lib/python3",), 0)  # type: ignore[operator]
    pending, seen = [hook], []
    while pending:
        function = pending.pop()
        seen.append(function.__name__)
        assert function.__closure__ is None
        loads = [i.argval for i in dis.get_instructions(function) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME", "LOAD_DEREF")]
        assert loads == [], f"{function.__name__} reads {loads}"
        pending += [d for d in function.__defaults__ or () if callable(d) and hasattr(d, "__code__")]
    assert {"hook", "check_open", "check_path", "check_import", "to_text", "resolve", "inside"} <= set(seen)


@pytest.mark.parametrize("code", [b"print(1)", "x" * (MAX_CODE_CHARS + 1)])
def test_bad_arguments_raise_a_tool_error(code: object) -> None:
    with pytest.raises(ToolError):
        PythonSandbox()(code)  # type: ignore[arg-type]


def test_bad_settings_are_named_by_its_rules_not_raised() -> None:
    assert PythonSandbox(memory_mb=1).config_problems() == [
        "memory_mb=1: must be >= 64 (the interpreter itself needs that)"]
    assert PythonSandbox().config_problems() == []


def test_a_sandbox_ends_with_the_job_that_started_it_when_the_job_is_killed(tmp_path: Path) -> None:
    """SIGKILL of the job mid-call: its sandbox goes with it (the kernel's parent-death signal), even a snippet that
    ignores the alarm that bounds it otherwise and sleeps for longer than the test runs."""
    import os
    import signal
    import subprocess
    import sys

    import psutil

    snippet = "import signal, time\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nprint('up', flush=True)\ntime.sleep(900)"
    job = subprocess.Popen(
        [sys.executable, "-c", "import sys\nfrom grpo_pipe.environments.tools.python import PythonSandbox\n"
         "PythonSandbox(wall_s=900, cpu_s=5)(sys.argv[1])", snippet],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120  # a bound on a hang, not a timing: start-up on a busy machine
        sandbox: list[psutil.Process] = []
        while not sandbox and time.monotonic() < deadline:
            sandbox = [p for p in psutil.Process(job.pid).children(recursive=True) if "-I" in p.cmdline()]
            time.sleep(0.2)
        assert sandbox, "the sandbox never started"
        os.kill(job.pid, signal.SIGKILL)
        job.wait(timeout=30)
        gone, alive = psutil.wait_procs(sandbox, timeout=30)
        assert alive == [], f"sandbox processes outlived the killed job: {alive}"
    finally:
        if job.poll() is None:
            job.kill()
