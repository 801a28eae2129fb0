"""The lint gate: `ruff check` (grpo_pipe + tests) and `pyright` (grpo_pipe, basic mode) find nothing.

Both read their settings from pyproject.toml and come with the `lint` extra (part of `test`). pyright runs
offline: the wheel bundles the checker, the machine's node runs it, and the wrapper's check for a newer
release on PyPI is switched off.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

BIN = Path(sys.executable).parent  # the venv's scripts, beside its python


def _run(tool: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    exe = BIN / tool
    if not exe.exists():
        pytest.fail(f"{exe} is missing: install the `lint` extra (pip install -e '.[lint]')")
    return subprocess.run([str(exe), *args], cwd=REPO, capture_output=True, text=True, timeout=600, env=env)


def test_ruff_finds_nothing() -> None:
    done = _run("ruff", "check", "--no-cache", "--output-format", "concise")
    assert done.returncode == 0, done.stdout + done.stderr


def test_pyright_finds_nothing() -> None:
    if shutil.which("node") is None:
        pytest.fail("pyright needs node on PATH (without it the pyright wrapper would download one)")
    env = {
        **os.environ,
        "PYRIGHT_PYTHON_GLOBAL_NODE": "1",  # the machine's node, never a downloaded one
        "PYRIGHT_PYTHON_IGNORE_WARNINGS": "1",  # no lookup of the latest release on PyPI
    }
    done = _run("pyright", "--pythonpath", sys.executable, env=env)  # this venv's packages, wherever it lives
    assert done.returncode == 0, done.stdout + done.stderr
