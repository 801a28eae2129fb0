"""A random-init model is built in a process of its own, so the device memory its initialisation takes goes back
before the engine and the trainer start (a 7B build on a GPU left 30 GB cached on the card Ray then gave the engine)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from grpo_pipe.models.random_architecture import in_child_process


def write_pid(out: Path) -> None:
    out.write_text(str(os.getpid()))


def fail(out: Path) -> None:
    raise ValueError("no room on the device")


def test_the_build_runs_in_another_process(tmp_path: Path) -> None:
    marker = tmp_path / "pid"
    in_child_process(write_pid, marker)
    assert int(marker.read_text()) != os.getpid()


def test_a_build_that_fails_in_its_process_fails_the_run(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="fail failed in its own process"):
        in_child_process(fail, tmp_path)
