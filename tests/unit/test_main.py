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
