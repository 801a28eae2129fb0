"""The command itself: `--version` names grpo_pipe's version and the libraries a run's numbers depend on, and exits 0
without composing a job."""

import subprocess
import sys
from importlib.metadata import version


def test_version_prints_grpo_pipes_version_and_the_engines_and_torchs() -> None:
    done = subprocess.run([sys.executable, "-m", "grpo_pipe", "--version"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip()
    assert line.startswith(f"grpo_pipe {version('grpo_pipe')} ")
    assert f"torch {version('torch')}" in line and "vllm " in line and "not installed" not in line.split("python")[0]
    assert "Hydra" not in line  # Hydra's own --version is not what a user of this command asks for


def test_the_console_is_plain_unwrapped_lines_when_it_is_not_a_terminal(capsys) -> None:
    import logging

    from grpo_pipe.runner.progress import console_handler

    handler = console_handler()  # pytest's captured stdout is not a terminal
    assert type(handler) is logging.StreamHandler
    record = logging.LogRecord("grpo_pipe", logging.WARNING, __file__, 1, "continue with: python -m grpo_pipe "
                               "resume=" + "/very/long/path" * 12, None, None)
    handler.emit(record)
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "resume=/very/long/path" in out and "WARNING" in out
