"""The chaos driver's choices and its check of files outside the run's folder."""

from __future__ import annotations

import random
from pathlib import Path

from grpo_pipe.benchmarks.chaos import PHASES, files_under, phase_order, pick_point


def test_every_kill_falls_two_or_three_steps_past_the_last_checkpoint_and_never_past_the_run() -> None:
    rng = random.Random(0)
    assert {pick_point(rng, "update", last_checkpoint=4, steps=30) for _ in range(100)} == {"update@6", "update@7"}
    assert {pick_point(rng, "checkpoint", last_checkpoint=29, steps=30) for _ in range(20)} == {"checkpoint@30"}
    assert all(1 <= int(pick_point(rng, "tool", 4, 30).removeprefix("tool@")) <= 60 for _ in range(100))


def test_ten_kills_meet_every_phase_and_the_first_is_no_tool_call() -> None:
    for seed in range(50):
        order = phase_order(random.Random(seed), 10)
        assert len(order) == 10 and set(order) == set(PHASES) and order[0] != "tool", (seed, order)


def test_a_file_changed_outside_the_run_folder_is_found_and_the_run_folder_is_left_out(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "cache.bin").write_bytes(b"1")
    before = files_under([tmp_path], skip=tmp_path / "run")
    (tmp_path / "run" / "checkpoint").write_bytes(b"new")
    (tmp_path / "cache.bin").write_bytes(b"22")
    after = files_under([tmp_path], skip=tmp_path / "run")
    assert [path for path in after if before.get(path) != after[path]] == [str(tmp_path / "cache.bin")]
