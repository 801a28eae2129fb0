"""The chaos driver's choices and its check of files outside the run's folder."""

from __future__ import annotations

import random
from pathlib import Path

from grpo_pipe.benchmarks.chaos import PHASES, files_under, pick_point


def test_every_kill_falls_two_or_three_steps_past_the_last_checkpoint_in_one_of_the_phases() -> None:
    rng = random.Random(0)
    points = [pick_point(rng, last_checkpoint=4, steps=30) for _ in range(200)]
    phases = {p.partition("@")[0] for p in points}
    assert phases == set(PHASES)
    assert {int(p.partition("@")[2]) for p in points if not p.startswith("tool@")} == {6, 7}
    assert all(int(p.partition("@")[2]) <= 30 for p in (pick_point(rng, 29, 30) for _ in range(50)) if "tool" not in p)


def test_no_tool_call_is_picked_before_the_first_checkpoint() -> None:
    rng = random.Random(0)
    assert not any(pick_point(rng, last_checkpoint=0, steps=30).startswith("tool@") for _ in range(200))


def test_a_file_changed_outside_the_run_folder_is_found_and_the_run_folder_is_left_out(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "cache.bin").write_bytes(b"1")
    before = files_under([tmp_path], skip=tmp_path / "run")
    (tmp_path / "run" / "checkpoint").write_bytes(b"new")
    (tmp_path / "cache.bin").write_bytes(b"22")
    after = files_under([tmp_path], skip=tmp_path / "run")
    assert [path for path in after if before.get(path) != after[path]] == [str(tmp_path / "cache.bin")]
