"""An output folder that cannot be written is one error in the project's format, before Hydra or any model runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from grpo_pipe.config.output_dirs import output_dir_problems, remove_if_empty, unmade_output_dirs
from tests.conftest import REPO


def test_a_file_in_the_way_of_the_run_folder_is_named_with_the_setting(tmp_path: Path) -> None:
    (tmp_path / "taken").write_text("a file, not a folder")
    problems = output_dir_problems([f"hydra.run.dir={tmp_path}/taken/runs/${{now:%H}}"], tmp_path)
    assert len(problems) == 1
    assert problems[0].startswith(f"hydra.run.dir={tmp_path}/taken/runs/${{now:%H}}: cannot write")
    assert f"{tmp_path / 'taken'} is a file" in problems[0] and "hydra.run.dir=/tmp/grpo_pipe/runs" in problems[0]


def test_writable_defaults_pass_and_the_check_leaves_nothing_behind(tmp_path: Path) -> None:
    assert output_dir_problems(["model=tiny_random", "+hydra.sweep.dir=sweeps/${now:%H}"], tmp_path) == []
    assert list(tmp_path.iterdir()) == []  # neither outputs/ nor sweeps/ made, no probe file left


def test_the_command_refuses_an_unwritable_output_folder_in_one_block(tmp_path: Path) -> None:
    (tmp_path / "taken").write_text("")
    done = subprocess.run([sys.executable, "-m", "grpo_pipe", f"hydra.run.dir={tmp_path}/taken/run"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    out = done.stdout + done.stderr
    assert done.returncode == 2 and "Traceback" not in out, out
    assert "Invalid config:" in out and f"hydra.run.dir={tmp_path}/taken/run: cannot write" in out


def test_a_refused_job_removes_the_output_folders_it_made_and_only_those(tmp_path: Path) -> None:
    (tmp_path / "kept").mkdir()
    unmade = unmade_output_dirs([f"hydra.run.dir={tmp_path}/kept/runs/${{now:%H}}"], tmp_path)
    assert unmade == [tmp_path / "kept" / "runs", tmp_path / "outputs"]  # the run folder given, the sweep default
    (tmp_path / "kept" / "runs" / "12").mkdir(parents=True)  # what Hydra made (the job folder itself already gone)
    (tmp_path / "outputs" / "mlartifacts").mkdir(parents=True)
    (tmp_path / "outputs" / "mlflow.db").write_text("")
    for folder in unmade:
        remove_if_empty(folder)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept", "outputs"] and list((tmp_path / "kept").iterdir()) == []
    assert (tmp_path / "outputs" / "mlartifacts").is_dir()  # a folder holding a file stays whole


def test_a_command_refused_before_hydra_runs_leaves_no_outputs_folder(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "grpo_pipe", "trainer.lrr=1", "reward.wrong=abc"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "reward.wrong='abc': expected a number" in done.stderr, done.stderr
    assert list(tmp_path.iterdir()) == []  # the check of the tracker's folders made outputs/: it is gone again
