"""Checkpoints of the real trainer's state, and the damage a crash or a bad disk does to them: shared by the unit
tier (resume's choices, by hand) and the integration tier (the command that meets them)."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import torch

from grpo_pipe.checkpoint.store import CheckpointManager
from tests.fakes import scored_groups


def train_two_states() -> list[dict]:
    """The real trainer's whole state after one and after two updates of the tiny model."""
    from grpo_pipe.models.tiny_random import TinyRandomModel
    from grpo_pipe.trainer.grpo import GRPOTrainer
    from grpo_pipe.trainer.policy import FullFinetunePolicy
    from grpo_pipe.trainer.settings import OptimisationSettings

    trainer = GRPOTrainer(policy=FullFinetunePolicy(), steps=3, optimisation=OptimisationSettings(lr=1e-3))
    trainer.setup(TinyRandomModel().materialize(), torch.device("cpu"), pad_id=0)
    states = []
    for _ in range(2):
        trainer.step(*scored_groups(), temperature=1.0)
        states.append(copy.deepcopy(trainer.state_dict()))
    return states


def two_checkpoints(runs_dir: Path, states: list[dict]) -> tuple[Path, Path]:
    manager = CheckpointManager(every=1, keep_last=2)
    manager.attach(runs_dir / "run")
    first, second = (manager.save(step, states[step - 1], {"step": step}, "a: 1\n") for step in (1, 2))
    return first.path, second.path


def truncate(folder: Path) -> None:
    path = folder / "trainer.pt"
    os.truncate(path, path.stat().st_size // 2)  # what a crash of the disk's write-back leaves


def flip_bytes(folder: Path) -> None:
    with (folder / "trainer.pt").open("r+b") as f:  # same size, three bytes changed in the middle
        f.seek(f.seek(0, os.SEEK_END) // 2)
        middle = f.read(3)
        f.seek(-3, os.SEEK_CUR)
        f.write(bytes(b ^ 0xFF for b in middle))
