"""Checkpoints are atomic and pruned; resume refuses a changed config; the pieces by hand."""

import json
import os
from pathlib import Path

import pytest
import torch

from grpo_pipe.checkpointing import CheckpointManager, config_differences, find_resume_checkpoint


def _save(manager: CheckpointManager, step: int) -> None:
    manager.save(step, {"w": torch.full((3,), float(step))}, {"step": step}, f"step: {step}\n")


def test_keeps_the_newest_and_loads_what_was_saved(tmp_path) -> None:
    manager = CheckpointManager(every=1, keep_last=2)
    manager.attach(tmp_path)
    for step in (1, 2, 3):
        _save(manager, step)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["step-000002", "step-000003"]
    latest = manager.latest()
    assert latest.step == 3 and latest.loop_state() == {"step": 3}
    assert torch.equal(latest.trainer_state()["w"], torch.full((3,), 3.0))


def test_a_writer_killed_before_the_rename_leaves_the_previous_checkpoint_loadable(tmp_path, monkeypatch) -> None:
    manager = CheckpointManager(every=1, keep_last=2)
    manager.attach(tmp_path)
    _save(manager, 1)

    def killed(src, dst):  # the process dies between writing the files and renaming the folder
        raise SystemExit("killed")

    monkeypatch.setattr(os, "rename", killed)
    with pytest.raises(SystemExit):
        _save(manager, 2)
    monkeypatch.undo()
    assert manager.latest().step == 1 and manager.latest().loop_state() == {"step": 1}
    assert find_resume_checkpoint(str(tmp_path), tmp_path.parent).step == 1


def test_a_temporary_left_by_a_hard_kill_is_ignored_and_cleaned(tmp_path) -> None:
    manager = CheckpointManager(every=1, keep_last=2)
    manager.attach(tmp_path)
    _save(manager, 1)
    half = tmp_path / "checkpoints" / ".step-000002.abc"  # what kill -9 mid-write leaves behind
    half.mkdir()
    (half / "trainer.pt").write_bytes(b"truncated")
    assert manager.latest().step == 1
    _save(manager, 2)
    assert not half.exists()


def test_best_is_exported_only_on_improvement(tmp_path) -> None:
    manager = CheckpointManager(best_metric="eval/accuracy")
    manager.attach(tmp_path)
    written = []

    def export(folder: Path) -> None:
        (folder / "weights").write_text(str(len(written)))
        written.append(folder)

    assert manager.consider_best({"eval/accuracy": 0.2}, export)
    assert not manager.consider_best({"eval/accuracy": 0.2}, export)
    assert manager.consider_best({"eval/accuracy": 0.5}, export)
    best = tmp_path / "checkpoints" / "best"
    assert json.loads((best / "best.json").read_text()) == {"eval/accuracy": 0.5}
    assert (best / "weights").read_text() == "1"


def test_config_differences_names_dotted_keys() -> None:
    saved = {"trainer": {"lr": 1e-3, "steps": 3}, "model": {"arch": "a"}}
    current = {"trainer": {"lr": 1e-3, "steps": 5}, "model": {"arch": "b"}, "extra": 1}
    assert config_differences(saved, current) == ["extra", "model.arch", "trainer.steps"]


def test_resume_without_a_checkpoint_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        find_resume_checkpoint(str(tmp_path), tmp_path)
    with pytest.raises(FileNotFoundError, match="resume=latest"):
        find_resume_checkpoint("latest", tmp_path)


def test_a_real_trainer_state_loads_with_weights_only_and_restores_every_rng(tmp_path) -> None:
    import random

    import numpy as np

    from grpo_pipe.models.tiny_random import TinyRandomModel
    from grpo_pipe.trainer.grpo import GRPOTrainer
    from grpo_pipe.trainer.policy import FullFinetunePolicy
    from tests.trainer.test_grpo import _groups

    trainer = GRPOTrainer(FullFinetunePolicy(), steps=3, lr=1e-3)
    trainer.setup(TinyRandomModel().materialize(), torch.device("cpu"), pad_id=0)
    trainer.step(*_groups(), temperature=1.0)  # optimizer and schedule state that is not all zeros
    manager = CheckpointManager(every=1, keep_last=1)
    manager.attach(tmp_path)
    torch.manual_seed(1), np.random.seed(2), random.seed(3)
    saved = manager.save(1, trainer.state_dict(), {"step": 1}, "")
    expected = (torch.rand(3), np.random.rand(3), [random.random() for _ in range(3)])
    torch.manual_seed(9), np.random.seed(9), random.seed(9)
    trainer.load_state_dict(saved.trainer_state())  # torch.load(..., weights_only=True) inside
    assert torch.equal(torch.rand(3), expected[0])
    assert np.array_equal(np.random.rand(3), expected[1])
    assert [random.random() for _ in range(3)] == expected[2]
    assert set(saved.trainer_state()["rng"]) == {"torch", "cuda", "numpy", "python"}
